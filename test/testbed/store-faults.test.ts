// The store-fault matrix (issue 20; store-fault-matrix.ts): one test per fault of the cluster store, each
// running every event of the matrix under that fault on one testbed and checking the invariants in every
// cell; the matrix is printed when all rows have run (docs/testing.md, "Store faults").
// Every row runs dual-stack (families [4, 6]): the Egress and the Service are dual-stack, and every cell
// carries IPv6 connections (through the Egress, and through the IPv6 VIP in the LB cells) beside the IPv4
// ones, with the same checks on the IPv6 addresses, blocks and VIP as on the IPv4 ones.
// STORE_MATRIX_FAULTS=down,cut and STORE_MATRIX_EVENTS=join,podkill run a part of it (for debugging);
// STORE_MATRIX_FAMILIES=4 runs it IPv4 only.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { IpFamily } from '../../lib/ip';
import { EVENTS, FAULTS, formatMatrix, runRow, type CellResult, type EventId, type FaultId } from './store-fault-matrix';

const onlyFaults = process.env.STORE_MATRIX_FAULTS?.split(',') as FaultId[] | undefined;
const onlyEvents = process.env.STORE_MATRIX_EVENTS?.split(',') as EventId[] | undefined;
const families = (process.env.STORE_MATRIX_FAMILIES ?? '4,6').split(',').map(Number) as IpFamily[];
const results: CellResult[] = [];
const t0 = Date.now();

for (const f of FAULTS) {
  const name = `store ${f.label}: ${EVENTS.filter((e) => !onlyEvents || onlyEvents.includes(e.id)).map((e) => e.label).join(', ')} — no address twice, no move from a live owner, connections kept`;
  const run = async () => {
    const t = Date.now();
    const cells = await runRow(f.id, (line) => process.stdout.write(`${line}\n`), onlyEvents, families);
    results.push(...cells);
    process.stdout.write(`  ${f.label}: ${cells.filter((c) => c.pass).length}/${cells.length} cells pass in ${((Date.now() - t) / 1000).toFixed(0)} s\n`);
    const failed = cells.filter((c) => !c.pass);
    if (families.includes(6)) assert.ok(cells.every((c) => (c.pass ? / v6 \d+\/\d+/.test(c.cell) : true)), `every passing cell counted IPv6 connections: ${cells.map((c) => c.cell).join(' | ')}`);
    assert.ok(failed.length === 0, `${failed.length} cells fail under "${f.label}":\n${failed.map((c) => `  ${c.event}: ${c.failures.slice(0, 3).join(' | ')}`).join('\n')}`);
  };
  if (onlyFaults ? !onlyFaults.includes(f.id) : f.control) test.skip(name, run);
  else test(name, run);
}

test.after(() => {
  if (results.length) process.stdout.write(`\nStore-fault matrix:\n${formatMatrix(results, Date.now() - t0)}\n`);
});

test.run();
