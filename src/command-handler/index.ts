/**
 * Command handling: decide in memory, become durable alongside.
 *
 * Each stream's state is kept in memory. `decide` runs the pure decider against the latest state at
 * once (later commands on the same stream decide against the state their predecessors left, even
 * before those are stored) and hands back the outcome with a promise of durability. Appends to one
 * stream leave one at a time, each carrying every decision made while the previous one was in
 * flight, so N commands on a hot stream cost about two group-commit round trips, not N.
 *
 * When another process wrote first (a conflict), the handler reads what it missed, decides every
 * affected command again in order, and tells each caller whose decision changed (its `superseded`
 * signal fires) so that work started on the old decision can be cancelled. A decision that appends
 * nothing (a rejection, a no-op) made on top of decisions still on their way is affected too: it waits
 * in line behind them and is final only once they are stored.
 *
 * Event ids are derived from the command id and the event's index, and the command id is recorded in
 * each event's metadata: a command sent again (a lost acknowledgement, a client retry) returns its
 * original result and appends nothing twice.
 *
 * The parts: handler.ts (deciding and becoming durable), stream-cache.ts (each stream's state in
 * memory), flush-schedule.ts (when decisions leave for the store; `PendingAppends` steers it),
 * resend-ids.ts (the command ids remembered), event-bus.ts (other processes' events), append.ts.
 */
export { CommandHandler } from './handler.ts';
export { commandIdKey, originKey, type CommandHandlerOptions, type CommandOptions, type Outcome, type PendingDecision } from './types.ts';
export { DecisionSuperseded } from './slot.ts';
export type { PendingAppends } from './flush-schedule.ts';
export type { ForeignEventListener } from './event-bus.ts';
export { eventIdFor } from './event-ids.ts';
