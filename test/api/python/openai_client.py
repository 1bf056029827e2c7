"""The official `openai` Python package against the gateway, as researchers call it.

Run by test/api/openai-python.test.ts: `python openai_client.py <scenario>`, with the gateway's
base URL and the key in SVC_BASE_URL and SVC_API_KEY (never on the command line). Each scenario
prints one JSON object on stdout; the TypeScript test asserts on it.
"""

import json
import os
import sys
from operator import itemgetter

import openai

MODEL = "ref-byte"
# ref-byte's vocabulary: ids 0-255 are the bytes, 256 the beginning of text (src/tokenizer/byte.ts).
BOS = 256


def client(**options):
    return openai.OpenAI(base_url=os.environ["SVC_BASE_URL"], api_key=os.environ["SVC_API_KEY"], **options)


def counting_client(**options):
    """A client with the package's defaults (two retries), and the HTTP requests it sends."""
    sent = []
    http = openai.DefaultHttpxClient(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    return client(http_client=http, **options), sent


def failure(err, sent=None):
    """What a researcher's except clause sees of an APIStatusError."""
    body = err.response.json()
    return {
        "exception": type(err).__name__,
        "is_api_status_error": isinstance(err, openai.APIStatusError),
        "status_code": err.status_code,
        "code": err.code,
        "type": err.type,
        "message": err.message,
        "request_id": err.request_id,
        "body_request_id": body.get("request_id"),
        "retry_after": err.response.headers.get("retry-after"),
        "x_should_retry": err.response.headers.get("x-should-retry"),
        "requests": None if sent is None else len(sent),
    }


def expect_failure(call, sent=None):
    try:
        call()
    except openai.APIStatusError as err:
        return failure(err, sent)
    raise AssertionError("the call succeeded")


def completion():
    c = client(max_retries=0)
    plain = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    # Engine-native sampling parameters go through extra_body, which the package merges into the body's top level.
    native = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0.7, seed=3, extra_body={"top_k": 5, "min_p": 0.01})
    return {"plain": plain.model_dump(), "native": native.model_dump()}


def batch():
    c = client(max_retries=0)
    prompts = ["Once", "upon a", "time!"]
    batched = c.completions.create(model=MODEL, prompt=prompts, max_tokens=3, temperature=0)
    singles = [c.completions.create(model=MODEL, prompt=p, max_tokens=3, temperature=0).choices[0].text for p in prompts]
    return {"batched": batched.model_dump(), "singles": singles}


def stream():
    c = client(max_retries=0)
    chunks = [chunk.model_dump() for chunk in c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})]
    whole = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    return {"chunks": chunks, "whole": whole.model_dump()}


def parse_logprobs(out, ctxlens):
    """lm-evaluation-harness's LocalCompletionsAPI.parse_logprobs (lm_eval/models/openai_completions.py):
    the continuation's tokens are [ctxlen:-1] (the last is the one generated token), greedy when each
    of their logprobs is the largest of its top_logprobs."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens):
        assert ctxlen > 0, "Context length must be greater than 0"
        logprobs = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])
        tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        is_greedy = True
        for tok, top in zip(tokens_logprobs, top_logprobs):
            if tok != max(top.values()):
                is_greedy = False
                break
        res.append((logprobs, is_greedy))
    return res


def loglikelihood():
    """lm-eval's loglikelihood requests as `local-completions` sends them: token-id prompts (context then
    continuation), batched, echo=True, logprobs=1, max_tokens=1, temperature 0."""
    c = client(max_retries=0)
    context = "Once upon a time"
    context_ids = [BOS] + list(context.encode())
    # The model's own greedy continuation of the context, with its logprobs as generated.
    generated = c.completions.create(model=MODEL, prompt=[context_ids], max_tokens=3, temperature=0, logprobs=0)
    greedy_text = generated.choices[0].text
    greedy_ids = list(greedy_text.encode())
    assert len(greedy_ids) == 3, f"the greedy continuation {greedy_text!r} is not three single-byte tokens"
    requests = [(context_ids, greedy_ids), (context_ids, list(" xqz".encode())), ([BOS] + list("Hello".encode()), list(", world".encode()))]
    payload = {"model": MODEL, "prompt": [ctx + cont for ctx, cont in requests], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    out = c.completions.create(**payload).model_dump()
    results = parse_logprobs(out, [len(ctx) for ctx, _ in requests])
    # The older harness (gpt3.py) asked for max_tokens=0 in the same request; the contract rejects 0.
    zero = expect_failure(lambda: c.completions.create(**{**payload, "max_tokens": 0}))
    return {
        "requests": [{"context_ids": ctx, "continuation_ids": cont} for ctx, cont in requests],
        "response": out,
        "results": [{"loglikelihood": ll, "is_greedy": greedy} for ll, greedy in results],
        "generated": generated.model_dump(),
        "max_tokens_zero": zero,
    }


def echo_text():
    """A text prompt echoed with its logprobs (lm-eval with tokenized_requests=False)."""
    c = client(max_retries=0)
    return c.completions.create(model=MODEL, prompt="Hi there", max_tokens=2, temperature=0, logprobs=2, echo=True).model_dump()


def bad_requests():
    c = client(max_retries=0)
    return {
        "model_not_found": expect_failure(lambda: c.completions.create(model="no-such-model", prompt="abc", max_tokens=2)),
        "unknown_field": expect_failure(lambda: c.completions.create(model=MODEL, prompt="abc", max_tokens=2, extra_body={"no_such_field": 1})),
        "chat": expect_failure(lambda: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])),
    }


def unauthenticated():
    c, sent = counting_client()
    return expect_failure(lambda: c.completions.create(model=MODEL, prompt="abc", max_tokens=2), sent)


def rate_limited():
    """One call with the package's default retries: the 429 it ends with, and how many requests it sent."""
    c, sent = counting_client()
    return expect_failure(lambda: c.completions.create(model=MODEL, prompt="Hello", max_tokens=8), sent)


SCENARIOS = {f.__name__: f for f in [completion, batch, stream, loglikelihood, echo_text, bad_requests, unauthenticated, rate_limited]}

if __name__ == "__main__":
    print(json.dumps({"openai_version": openai.__version__, "result": SCENARIOS[sys.argv[1]]()}))
