/** The in-process transport against the dispatch contract: consumers of one transport share its queue. */
import { inProcessTransport } from '../../src/dispatch/index.ts';
import { transportContract } from './transport-contract.ts';

transportContract({
  name: 'inprocess',
  async pair(timing) {
    const transport = inProcessTransport(timing);
    return [transport, transport];
  },
});
