/** The meter projections on PostgreSQL when DATABASE_URL is set (meter-projections.ts); skipped otherwise. */
import { suite } from 'uvu';
import { adaptersUnderTest } from '../store/adapters.ts';
import { meterProjectionSuite } from './meter-projections.ts';

const postgres = adaptersUnderTest().find((a) => a.name === 'postgres');
if (postgres) meterProjectionSuite(postgres);
else {
  const skipped = suite('meter projections (postgres)');
  skipped.skip('the meter projections on PostgreSQL: SKIPPED, DATABASE_URL is not set', () => {});
  skipped.run();
}
