/** The key decider's rules, given / when / then: issue, pause, resume, revoke, budgets. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { keyDecider, type KeyCommand, type KeyState } from '../../deciders/key.ts';
import { KeyBudgetsChanged, KeyIssued, KeyPaused, KeyResumed, KeyRevoked, keyEvents, keyStream, type KeyBudgetValues, type KeyEvent } from '../../events/key.ts';
import { decisionEvents, foldEvents, isRejection } from '../../src/event-sourcing/index.ts';
import { deciderSpecification } from '../support/decider-specification.ts';
import { unlimitedBudgets } from '../support/admit-request.ts';

const spec = deciderSpecification(keyDecider);
const key_id = '0123456789ab';
const sha = 'a'.repeat(64);
const t0 = '2026-11-24T10:00:00.000Z';
const t1 = '2026-11-24T11:00:00.000Z';
const budgets: KeyBudgetValues = { ...unlimitedBudgets, monthly_token_budget: 1_000_000, daily_token_budget: 50_000 };

const issue: KeyCommand = { type: 'IssueKey', keyId: key_id, secretSha256: sha, email: 'ada@example.com', userId: 'u-1', budgets, now: t0 };
const issued = KeyIssued({ key_id, secret_sha256: sha, email: 'ada@example.com', user_id: 'u-1', budgets, at: t0 });
const paused = KeyPaused({ key_id, at: t0 });
const resumed = KeyResumed({ key_id, at: t0 });
const revoked = KeyRevoked({ key_id, at: t0 });
const pause: KeyCommand = { type: 'PauseKey', now: t1 };
const resume: KeyCommand = { type: 'ResumeKey', now: t1 };
const revoke: KeyCommand = { type: 'RevokeKey', now: t1 };
const change = (b: Partial<KeyBudgetValues>): KeyCommand => ({ type: 'ChangeBudgets', budgets: b, now: t1 });

const status = (expected: KeyState['status']) => (state: KeyState) => assert.is(state.status, expected);

const issuing = suite('key decider: issue');
issuing('a new key is issued active, with its budgets and only the hash of its secret', () => {
  spec.given([]).when(issue).then([issued]);
  spec.given([]).when(issue).thenState((state) => {
    assert.equal(state, { status: 'active', keyId: key_id, secretSha256: sha, email: 'ada@example.com', userId: 'u-1', budgets, issuedAt: t0 });
  });
});
issuing('issuing the same key twice is rejected, whatever its status', () => {
  spec.given([issued]).when(issue).thenRejects('key_exists');
  spec.given([issued, paused]).when(issue).thenRejects('key_exists');
  spec.given([issued, revoked]).when(issue).thenRejects('key_exists');
});
issuing('the key stream is key-<keyId>', () => {
  assert.is(keyStream(key_id), 'key-0123456789ab');
});
issuing('commands on a key never issued are rejected key_not_found', () => {
  for (const command of [pause, resume, revoke, change({ daily_token_budget: 1 })]) spec.given([]).when(command).thenRejects('key_not_found');
});
issuing.run();

const lifecycle = suite('key decider: pause, resume, revoke');
lifecycle('an active key is paused', () => {
  spec.given([issued]).when(pause).then([KeyPaused({ key_id, at: t1 })]);
  spec.given([issued]).when(pause).thenState(status('paused'));
});
lifecycle('pausing a paused key appends nothing', () => {
  spec.given([issued, paused]).when(pause).thenNothing();
});
lifecycle('a paused key is resumed', () => {
  spec.given([issued, paused]).when(resume).then([KeyResumed({ key_id, at: t1 })]);
  spec.given([issued, paused]).when(resume).thenState(status('active'));
});
lifecycle('resuming an active key appends nothing', () => {
  spec.given([issued]).when(resume).thenNothing();
  spec.given([issued, paused, resumed]).when(resume).thenNothing();
});
lifecycle('an active or a paused key is revoked', () => {
  spec.given([issued]).when(revoke).then([KeyRevoked({ key_id, at: t1 })]);
  spec.given([issued, paused]).when(revoke).then([KeyRevoked({ key_id, at: t1 })]);
  spec.given([issued, paused]).when(revoke).thenState(status('revoked'));
});
lifecycle('revoking a revoked key appends nothing', () => {
  spec.given([issued, revoked]).when(revoke).thenNothing();
});
lifecycle('revocation is final: a revoked key cannot be resumed, paused or given budgets', () => {
  spec.given([issued, revoked]).when(resume).thenRejects('key_revoked');
  spec.given([issued, paused, revoked]).when(resume).thenRejects('key_revoked');
  spec.given([issued, revoked]).when(pause).thenRejects('key_revoked');
  spec.given([issued, revoked]).when(change({ monthly_token_budget: 5 })).thenRejects('key_revoked');
  // Even a change to the same values is refused: a revoked key's record is closed.
  spec.given([issued, revoked]).when(change({ monthly_token_budget: budgets.monthly_token_budget })).thenRejects('key_revoked');
});
lifecycle.run();

const budgeting = suite('key decider: budgets');
budgeting('only the budgets that change are recorded', () => {
  spec
    .given([issued])
    .when(change({ monthly_token_budget: budgets.monthly_token_budget, daily_token_budget: 10, monthly_output_token_budget: 7 }))
    .then([KeyBudgetsChanged({ key_id, budgets: { daily_token_budget: 10, monthly_output_token_budget: 7 }, at: t1 })]);
});
budgeting('a change to the current values appends nothing', () => {
  spec.given([issued]).when(change({ monthly_token_budget: 1_000_000, daily_token_budget: 50_000, monthly_input_token_budget: null })).thenNothing();
  spec.given([issued]).when(change({})).thenNothing();
});
budgeting('a budget can be removed (null: unlimited) and set from unlimited', () => {
  spec.given([issued]).when(change({ daily_token_budget: null })).then([KeyBudgetsChanged({ key_id, budgets: { daily_token_budget: null }, at: t1 })]);
  spec.given([issued]).when(change({ monthly_input_token_budget: 0 })).then([KeyBudgetsChanged({ key_id, budgets: { monthly_input_token_budget: 0 }, at: t1 })]);
});
budgeting('changed budgets merge into the key, the others stay', () => {
  const changed = KeyBudgetsChanged({ key_id, budgets: { daily_token_budget: 10, monthly_harvest_jobs: 3 }, at: t1 });
  spec.given([issued]).when(change({ daily_token_budget: 10, monthly_harvest_jobs: 3 })).thenState((state) => {
    if (state.status === 'none') return assert.unreachable('the key vanished');
    assert.equal(state.budgets, { ...budgets, daily_token_budget: 10, monthly_harvest_jobs: 3 });
  });
  spec.given([issued, changed]).when(change({ daily_token_budget: 10 })).thenNothing();
});
budgeting('a paused key can have its budgets changed', () => {
  spec.given([issued, paused]).when(change({ daily_token_budget: 1 })).then([KeyBudgetsChanged({ key_id, budgets: { daily_token_budget: 1 }, at: t1 })]);
});
budgeting('a budget left undefined (a field absent from a PATCH) is not a change', () => {
  // An undefined value would be dropped by JSON on the way to the store but kept in memory: the
  // decider's state and the stored stream would disagree about the budget (NaN arithmetic in the meter).
  const omitted = { daily_token_budget: undefined } as unknown as Partial<KeyBudgetValues>;
  spec.given([issued]).when(change(omitted)).thenNothing();
  spec
    .given([issued])
    .when(change({ monthly_token_budget: 3, daily_token_budget: undefined } as unknown as Partial<KeyBudgetValues>))
    .then([KeyBudgetsChanged({ key_id, budgets: { monthly_token_budget: 3 }, at: t1 })]);
});
budgeting.run();

const storage = suite('key decider: events as stored');
const history: KeyCommand[] = [issue, pause, pause, change({ daily_token_budget: 9 }), resume, change({ monthly_harvest_jobs: 0 }), revoke, revoke];
function run(commands: readonly KeyCommand[]): { events: KeyEvent[]; state: KeyState } {
  let state = keyDecider.initialState();
  const events: KeyEvent[] = [];
  for (const command of commands) {
    const decided = decisionEvents(keyDecider.decide(command, state));
    if (isRejection(decided)) continue;
    events.push(...decided);
    state = foldEvents(keyDecider, state, decided);
  }
  return { events, state };
}
storage('every event the decider produces passes the key catalogue', () => {
  const { events } = run(history);
  assert.equal(
    events.map((e) => e.type),
    ['KeyIssued', 'KeyPaused', 'KeyBudgetsChanged', 'KeyResumed', 'KeyBudgetsChanged', 'KeyRevoked'],
  );
  for (const event of events) keyEvents.check(event);
});
storage('events stored as JSON and parsed back evolve to the same state', () => {
  const { events, state } = run(history);
  const reloaded = events.map((e) => keyEvents.parse(JSON.parse(JSON.stringify({ type: e.type, data: e.data, metadata: { schema_version: keyEvents.versionOf(e.type) } }))));
  assert.equal(foldEvents(keyDecider, keyDecider.initialState(), reloaded), state);
});
storage.run();
