/** The meter projections on PGlite (meter-projections.ts). */
import { adaptersUnderTest } from '../store/adapters.ts';
import { meterProjectionSuite } from './meter-projections.ts';

for (const adapter of adaptersUnderTest().filter((a) => a.name === 'pglite')) meterProjectionSuite(adapter);
