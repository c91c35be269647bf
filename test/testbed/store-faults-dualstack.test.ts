// The store-fault matrix's Egress and load balancer cells in dual-stack (store-fault-matrix.ts with families
// [4, 6]): the floating pool, the Egress and the Service dual-stack (a RequireDualStack Service over a
// dual-stack LB pool), IPv6 connections through the Egress beside the IPv4 ones in every cell and through the
// IPv6 VIP beside the IPv4 VIP's in the LB cells (when the only LB node is lost, new connections through both
// VIPs before the store is back), under the fault that holds the store hung (SIGSTOP), the one that leaves a
// node's requests waiting longest.
// STORE_MATRIX_DS_FAULTS and STORE_MATRIX_DS_EVENTS choose other rows and cells.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { formatMatrix, runRow, type CellResult, type EventId, type FaultId } from './store-fault-matrix';

const faults = (process.env.STORE_MATRIX_DS_FAULTS ?? 'paused').split(',') as FaultId[];
const events = (process.env.STORE_MATRIX_DS_EVENTS ?? 'join,address,lbpod,podkill,nodelost,lblost').split(',') as EventId[];
const results: CellResult[] = [];
const t0 = Date.now();

for (const fault of faults) {
  test(`dual-stack, store ${fault}: ${events.join(', ')} — IPv4 and IPv6 connections kept (Egress, and VIP in the LB cells), no address twice, no move from a live owner`, async () => {
    const cells = await runRow(fault, (line) => process.stdout.write(`${line}\n`), events, [4, 6]);
    results.push(...cells);
    const failed = cells.filter((c) => !c.pass);
    assert.is(cells.length, events.length, 'a cell per event');
    assert.ok(cells.every((c) => c.pass ? / v6 \d+\/\d+/.test(c.cell) : true), `every passing cell counted IPv6 connections: ${cells.map((c) => c.cell).join(' | ')}`);
    const lbCells = cells.filter((c) => c.pass && (c.event === 'lbpod' || c.event === 'lblost'));
    assert.ok(lbCells.every((c) => /\+\d+\/\d+ v6 \d+\/\d+/.test(c.cell)), `every passing LB cell counted IPv6 VIP connections: ${lbCells.map((c) => c.cell).join(' | ')}`);
    assert.ok(failed.length === 0, `${failed.length} cells fail under "${fault}" in dual-stack:\n${failed.map((c) => `  ${c.event}: ${c.failures.slice(0, 3).join(' | ')}`).join('\n')}`);
  });
}

test.after(() => {
  if (results.length) process.stdout.write(`\nStore-fault matrix, dual-stack:\n${formatMatrix(results, Date.now() - t0)}\n`);
});

test.run();
