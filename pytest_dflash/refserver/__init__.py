"""The embedded reference host: a CPU test double of an SGLang 0.5.17 DFlash/DDTree server.

``python -m pytest_dflash.refserver [flags]``; docs/refserver.md lists every flag and fault. Modules:
``model`` (tiny transformer, drafter, tokenizer), ``spec`` (sampling, NONE/DFLASH/DDTREE steps),
``scheduler`` (the thread that runs requests), ``server`` (start-up), ``routes`` + ``openai_api``
(HTTP routes), ``state`` (what the routes share), ``params`` (sampling params), ``cost_model``
(the emulated GPU's costs), ``metrics``, ``logs``, ``server_args`` (flags), ``faults`` (+
``fault_site/``, ``grammar``, ``transcription``: import chains shaped like SGLang's), ``launch``
(``RefServerProcess`` for tests).
"""
