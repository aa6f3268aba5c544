"""HTTP client for one inference server, in two dialects: OpenAI (/v1/*) and SGLang native (/generate).

`client.inference` holds the client and its calls (`InferenceClient`), `client.sampling` what a call sends and
gets (`Sampling`, `Generation`: a view of an `Answer`, `Stream`), `client.answers` the one typed reading of a
generation answer, whole or streamed, native or OpenAI (`Answer`: finish, content, reasoning, tool calls,
usage, meta_info, logprobs, an error event inside a stream, a stream's framing; no other module reads an
answer's keys), `client.bodies` the byte caps, the decoding of bodies and error messages,
`client.sse` the reading of an SSE stream's lines,
`client.connect` the SSL context, proxies and the TCP liveness probe,
`client.deadline` the total-time bound enforced below httpx (`deadline`, `DeadlineExceeded`).

Explicit timeouts, no retries, and every failure mapped to `ApiError` — including the one that
matters most on a dying SGLang server: a request that gets no HTTP response at all
(`ApiError.status is None`, message "connection dropped").

Bodies are read with a byte cap (`response_cap`): a generation's cap follows from what the request
allows (max_tokens × n × prompts, logprobs), everything else gets `DEFAULT_MAX_BODY`, `/metrics`
`METRICS_MAX_BODY`. A body over its cap fails with its size (`ApiError.cause == "too-large"`) and is
never read whole, so a server answering megabytes to max_tokens=4 cannot fill memory or the reports.

Every request and every stream is bounded by TOTAL time, not only per read (httpx's timeouts are per
read: a server that drips a byte, a blank line or an SSE comment every 2 s would hold a call forever).
The deadline is the call's `timeout_s`, else the client's read timeout (the run's `--request-timeout`).
It is enforced below httpx, on every socket operation (connect, write, each read is given at most the
time left), so it covers response headers as well as the body; the body and SSE loops check it between
chunks too. Running out of it raises `DeadlineExceeded` (an `ApiError`, cause "timeout") naming the
endpoint, the limit and how far the call got (no response headers / status and bytes / SSE events and
tokens, seconds per token). `on_deadline`, when set (run/handle.py), is told first and may add what it
found out about the server (is the engine still making progress?) to the error's message.
"""
