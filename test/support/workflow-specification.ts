/**
 * Given / when / then for workflows, as decider-specification.ts is for deciders:
 *   spec.given([opened(D + 1, carrying X)]).when(ended(D, X)).then([release(D + 1, X)])
 * The given inputs are run through the workflow as the processor would (each one's commands are
 * recorded too), and every input is checked against the workflow's catalogue first, so a fixture
 * cannot drift from the schemas. `thenNothing` also asserts the input would not be recorded at all.
 *
 * Timers: the inputs a workflow schedules for itself (given inputs', `seededAt`'s, the when input's)
 * are kept as the processor keeps them, and `whenTick(at, view)` gives those due at `at`, earliest
 * first, as the processor would at that time: `thenFired` names them, `then` lists what they decided
 * (commands and schedules), and `andThen` goes on from there (a second tick fires nothing twice).
 */
import * as assert from 'uvu/assert';
import {
  isScheduled,
  reactTo,
  workflowStream,
  type DomainEvent,
  type Workflow,
  type WorkflowInput,
  type WorkflowOutput,
  type WorkflowSchedule,
} from '../../src/event-sourcing/index.ts';

interface Timer<Input extends DomainEvent> {
  readonly at: string;
  readonly timerId: string;
  readonly input: Input;
  readonly stream: string;
}

interface Scenario<Input extends DomainEvent, State> {
  readonly state: State;
  /** Scheduled and not fired yet, by timer id. */
  readonly pending: ReadonlyMap<string, Timer<Input>>;
  readonly fired: ReadonlySet<string>;
}

export function workflowSpecification<Input extends DomainEvent, State, Command, View = undefined>(workflow: Workflow<Input, State, Command, View>) {
  const check = (input: WorkflowInput<Input>, types: readonly string[]) => {
    workflow.inputs.check(input);
    assert.ok(types.includes(input.type), `${input.type} is not an input of ${workflow.name}`);
  };
  /** The scenario after a reaction: its schedules added to the pending timers (one known already is left as it is). */
  const after = (scenario: Scenario<Input, State>, input: WorkflowInput<Input>, outputs: readonly WorkflowOutput<Input, Command>[], state: State): Scenario<Input, State> => {
    const pending = new Map(scenario.pending);
    const stream = workflowStream(workflow.name, workflow.instanceOf(input));
    for (const output of outputs.filter(isScheduled)) {
      const { at, timerId, input: scheduled } = output.schedule;
      check({ ...scheduled, id: timerId, streamId: stream } as WorkflowInput<Input>, workflow.scheduledTypes ?? []);
      if (!scenario.fired.has(timerId) && !pending.has(timerId)) pending.set(timerId, { at, timerId, input: scheduled, stream });
    }
    return { state, pending, fired: scenario.fired };
  };
  const seeds = (schedules: readonly WorkflowSchedule<Input>[]) =>
    new Map(schedules.map(({ schedule: s }) => [s.timerId, { ...s, stream: workflowStream(workflow.name, workflow.instanceOf({ ...s.input, id: s.timerId, streamId: '' } as WorkflowInput<Input>)) }]));

  const scenarioApi = (scenario: Scenario<Input, State>) => ({
    when(input: WorkflowInput<Input>, view?: View) {
      check(input, workflow.inputTypes);
      const reaction = reactTo(workflow, scenario.state, input, view);
      const next = reaction ? after(scenario, input, reaction.outputs, reaction.state) : scenario;
      return {
        then(expected: readonly WorkflowOutput<Input, Command>[]) {
          assert.equal(reaction?.outputs ?? [], expected);
        },
        /** No output, and no change of state: the input is not even recorded. */
        thenNothing() {
          assert.is(reaction, null, `expected nothing, got ${JSON.stringify(reaction?.outputs)}`);
        },
        thenState(check: (state: State) => void) {
          check(reaction?.state ?? scenario.state);
        },
        /** The instance an input belongs to. */
        instance: () => workflow.instanceOf(input),
        andThen: () => scenarioApi(next),
      };
    },
    /** The processor's round at `at`: every timer due by then, given in due order (each reading `view`). */
    whenTick(at: string, view?: View) {
      let current = scenario;
      const fired: string[] = [];
      const outputs: WorkflowOutput<Input, Command>[] = [];
      for (;;) {
        const due = [...current.pending.values()].filter((t) => Date.parse(t.at) <= Date.parse(at)).sort((a, b) => Date.parse(a.at) - Date.parse(b.at) || a.timerId.localeCompare(b.timerId))[0];
        if (!due) break;
        const input = { ...due.input, id: due.timerId, streamId: due.stream, firedAt: at } as WorkflowInput<Input>;
        const reaction = reactTo(workflow, current.state, input, view)!;
        const pending = new Map(current.pending);
        pending.delete(due.timerId);
        current = after({ state: current.state, pending, fired: new Set([...current.fired, due.timerId]) }, input, reaction.outputs, reaction.state);
        fired.push(due.timerId);
        outputs.push(...reaction.outputs);
      }
      return {
        /** The timers that fired, in order. */
        thenFired(expected: readonly string[]) {
          assert.equal(fired, expected);
        },
        /** What the fired timers decided, in order (commands and the inputs they scheduled). */
        then(expected: readonly WorkflowOutput<Input, Command>[]) {
          assert.equal(outputs, expected);
        },
        thenNothing() {
          assert.equal(fired, [], `expected no timer due at ${at}, fired ${fired.join(', ')}`);
        },
        thenState(check: (state: State) => void) {
          check(current.state);
        },
        /** The timers still pending after the round, earliest first. */
        pending: () => [...current.pending.values()].sort((a, b) => Date.parse(a.at) - Date.parse(b.at)).map((t) => ({ at: t.at, timerId: t.timerId })),
        andThen: () => scenarioApi(current),
      };
    },
  });

  return {
    /** `seededAt`: the processor seeded the workflow (its `seed`) at that time first. */
    given(inputs: readonly WorkflowInput<Input>[] = [], options: { seededAt?: string } = {}) {
      let scenario: Scenario<Input, State> = {
        state: workflow.initialState(),
        pending: options.seededAt !== undefined && workflow.seed ? seeds(workflow.seed(options.seededAt)) : new Map(),
        fired: new Set(),
      };
      for (const input of inputs) {
        check(input, workflow.inputTypes);
        const reaction = reactTo(workflow, scenario.state, input);
        if (reaction) scenario = after(scenario, input, reaction.outputs, reaction.state);
      }
      return scenarioApi(scenario);
    },
  };
}
