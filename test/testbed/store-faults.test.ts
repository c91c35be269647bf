// The store-fault matrix (issue 20; store-fault-matrix.ts): one test per fault of the cluster store, each
// running every event of the matrix under that fault on one testbed and checking the invariants in every
// cell; the matrix is printed when all rows have run (docs/testing.md, "Store faults").
// STORE_MATRIX_FAULTS=down,cut and STORE_MATRIX_EVENTS=join,podkill run a part of it (for debugging).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { EVENTS, FAULTS, formatMatrix, runRow, type CellResult, type EventId, type FaultId } from './store-fault-matrix';

const onlyFaults = process.env.STORE_MATRIX_FAULTS?.split(',') as FaultId[] | undefined;
const onlyEvents = process.env.STORE_MATRIX_EVENTS?.split(',') as EventId[] | undefined;
const results: CellResult[] = [];
const t0 = Date.now();

for (const f of FAULTS) {
  const name = `store ${f.label}: ${EVENTS.filter((e) => !onlyEvents || onlyEvents.includes(e.id)).map((e) => e.label).join(', ')} — no address twice, no move from a live owner, connections kept`;
  const run = async () => {
    const t = Date.now();
    const cells = await runRow(f.id, (line) => process.stdout.write(`${line}\n`), onlyEvents);
    results.push(...cells);
    process.stdout.write(`  ${f.label}: ${cells.filter((c) => c.pass).length}/${cells.length} cells pass in ${((Date.now() - t) / 1000).toFixed(0)} s\n`);
    const failed = cells.filter((c) => !c.pass);
    assert.ok(failed.length === 0, `${failed.length} cells fail under "${f.label}":\n${failed.map((c) => `  ${c.event}: ${c.failures.slice(0, 3).join(' | ')}`).join('\n')}`);
  };
  if (onlyFaults ? !onlyFaults.includes(f.id) : f.control) test.skip(name, run);
  else test(name, run);
}

test.after(() => {
  if (results.length) process.stdout.write(`\nStore-fault matrix:\n${formatMatrix(results, Date.now() - t0)}\n`);
});

test.run();
