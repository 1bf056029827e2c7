/**
 * Given / when / then for workflows, as decider-specification.ts is for deciders:
 *   spec.given([opened(D + 1, carrying X)]).when(ended(D, X)).then([release(D + 1, X)])
 * The given inputs are run through the workflow as the processor would (each one's commands are
 * recorded too), and every input is checked against the workflow's catalogue first, so a fixture
 * cannot drift from the schemas. `thenNothing` also asserts the input would not be recorded at all.
 */
import * as assert from 'uvu/assert';
import { reactTo, type DomainEvent, type Workflow, type WorkflowCommand, type WorkflowInput } from '../../src/event-sourcing/index.ts';

export function workflowSpecification<Input extends DomainEvent, State, Command>(workflow: Workflow<Input, State, Command>) {
  const check = (input: WorkflowInput<Input>) => {
    workflow.inputs.check(input);
    assert.ok(workflow.inputTypes.includes(input.type), `${input.type} is not an input of ${workflow.name}`);
  };
  return {
    given(inputs: readonly WorkflowInput<Input>[] = []) {
      let state = workflow.initialState();
      for (const input of inputs) {
        check(input);
        state = reactTo(workflow, state, input)?.state ?? state;
      }
      return {
        when(input: WorkflowInput<Input>) {
          check(input);
          const reaction = reactTo(workflow, state, input);
          return {
            then(expected: readonly WorkflowCommand<Command>[]) {
              assert.equal(reaction?.outputs ?? [], expected);
            },
            /** No command, and no change of state: the input is not even recorded. */
            thenNothing() {
              assert.is(reaction, null, `expected nothing, got ${JSON.stringify(reaction?.outputs)}`);
            },
            thenState(check: (state: State) => void) {
              check(reaction?.state ?? state);
            },
            /** The instance an input belongs to. */
            instance: () => workflow.instanceOf(input),
          };
        },
      };
    },
  };
}
