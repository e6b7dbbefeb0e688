"""Inference engines behind one token-level wire protocol (SGLang's native ``/generate``).

Modules (import what you need; nothing heavy is imported here):

- ``protocol``: pydantic request/response types of the wire protocol.
- ``client``: ``EngineClient``, the async httpx client (works against SGLang too).
- ``runner``: ``ServerRunner``, serves any ASGI app with uvicorn on 127.0.0.1 (tests, benchmarks).
- ``app``: ``create_app(engine)``, the FastAPI app of any engine.
- ``base``: ``Engine``, what every engine shares (requests, abort, pause, weights version).
- ``embedded``: ``EmbeddedEngine``, a Hugging Face causal LM on CPU with continuous batching
  (``batch``, ``sampling``, ``prefix_cache`` are its parts).
- ``scripted`` + ``script``: ``ScriptedEngine``, a test double replaying fixed assistant turns
  through the real tokenizer.
- ``null``: ``NullEngine``, instant fixed tokens for overhead benchmarks.
- ``config``: typed configs; ``cli``: ``gyre engine``.
"""
