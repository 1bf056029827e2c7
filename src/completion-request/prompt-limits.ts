// The prompt's own limits: the context rule, the full-vocabulary cap and the vocabulary of token ids.
import { apiError } from '../errors/index.ts';
import { invalid } from './schema-errors.ts';

/**
 * The contract's context rule: prompt tokens + max_tokens within max_model_len, or, for an injected default, at
 * least one token of room. `tokens` is the prompt's count, or a lower bound on it (`said` then says "at least").
 */
export function checkContext(promptName: string, said: string, tokens: number, explicitMax: number | null, maxModelLen: number, modelId: string, reportedBy = ''): void {
  if (explicitMax !== null && tokens + explicitMax > maxModelLen) {
    throw apiError(
      'context_length_exceeded',
      `${promptName}: ${said} prompt tokens + max_tokens ${explicitMax} = ${tokens + explicitMax} exceeds the context length ${maxModelLen} of model ${modelId}${reportedBy}`,
      { fields: { param: 'prompt' } },
    );
  }
  if (explicitMax === null && tokens >= maxModelLen) {
    throw apiError(
      'context_length_exceeded',
      `${promptName}: ${said} prompt tokens leave no room to generate within the context length ${maxModelLen} of model ${modelId}${reportedBy}`,
      { fields: { param: 'prompt' } },
    );
  }
}

/** prompt_logprobs -1 is served up to the model's full-vocabulary prompt cap. */
export function checkFullVocab(promptName: string, said: string, tokens: number, cap: number): void {
  if (tokens > cap) {
    throw apiError('full_vocab_prompt_too_long', `${promptName}: ${said} tokens is longer than the ${cap} tokens allowed with prompt_logprobs -1 (full vocabulary)`, {
      fields: { param: 'prompt' },
    });
  }
}

export function checkVocab(ids: readonly number[], vocabSize: number, name: string): void {
  for (let j = 0; j < ids.length; j++) {
    if (ids[j] >= vocabSize) {
      throw invalid('prompt', `${name}[${j}]: token id ${ids[j]} is out of range (the vocabulary has ${vocabSize} ids, 0..${vocabSize - 1})`);
    }
  }
}
