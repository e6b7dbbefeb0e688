"""Typed proxy configuration (composed into the top-level Gyre config by the lead)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PoolConfig(BaseModel):
    """How the engine pool (:class:`gyre.proxy.pool.EnginePool`) treats slow and failing engines.

    The fields are ProxyConfig's too (it extends this model), so a config file and ``--set``
    name them flat (``proxy.engine_wait_s``); each default is written here only."""

    max_resumes: int = Field(
        16, description="How often one call may be moved between engines before failing."
    )
    kv_migration: bool = Field(
        True,
        description="A call drained off an engine moves with its K/V when both engines can "
        "(embedded engines on the same weights, gyre.proxy.kvmove); else it is prefilled again.",
    )
    kv_migration_timeout_s: float = Field(
        30.0, gt=0, description="Longest one call's K/V transfer may take before it is prefilled."
    )
    engine_timeout_s: float | None = Field(
        None, description="Read timeout towards engines (None: no limit)."
    )
    engine_wait_s: float = Field(
        600.0,
        description="How long a call waits for an engine to be in the pool (a switch removes "
        "them all for a while) before a 503 with Retry-After.",
    )
    engine_first_byte_timeout_s: float | None = Field(
        None,
        description="Hard limit on an engine attempt's wait for its first data (queue + prefill; "
        "the whole generation for a non-streamed call), even while the engine answers probes "
        "(None: none; a frozen engine is caught by the probe).",
    )
    engine_idle_timeout_s: float | None = Field(
        600.0,
        description="Hard limit on the silence between two chunks of a stream, even while the "
        "engine answers probes (a stuck request); the call moves on with its output so far.",
    )
    engine_probe_after_s: float | None = Field(
        10.0,
        description="After this long without a byte from an engine, a waiting call asks it for "
        "/get_model_info (one probe per engine, shared); no answer within "
        "engine_probe_timeout_s: the engine is frozen, the call moves on (None: no probes).",
    )
    engine_probe_timeout_s: float = Field(10.0, description="See engine_probe_after_s.")
    engine_heartbeat_s: float | None = Field(
        2.0,
        gt=0.0,
        description="Every this many seconds the pool pings every engine (/get_model_info; any "
        "HTTP answer counts) whether or not a call waits on it (None: no heartbeat).",
    )
    engine_lost_after_s: float = Field(
        10.0,
        gt=0.0,
        description="An engine from which nothing came (ping answer, stream byte) this long is "
        "lost: out of routing at once, its calls resumed elsewhere with their tokens so far. "
        "A killed or frozen engine is found within this plus engine_heartbeat_s.",
    )
    engine_rejoin: bool = Field(
        True,
        description="A lost engine that answers a heartbeat again is routed to again (false: it "
        "stays out until added again; the owner hears of it either way).",
    )
    engine_max_attempts: int = Field(
        8, description="Failed engine attempts one call may make before a 503/504."
    )
    engine_retry_budget_s: float = Field(
        30.0, description="No new engine attempt starts this long after a call's first failure."
    )


class SamplingConfig(BaseModel):
    """The run's sampling distribution and what the proxy does with a harness's own
    ``temperature``/``top_p``/``top_k`` (``[proxy.sampling]``; docs/engine.md, "Sampling
    semantics").

    A field set here is the run's: the proxy sends it on every engine request, whatever the
    harness asked. A field left unset passes the harness's value through (else the engine's
    default: temperature 1, no truncation). ``gyre run`` sets every unset field to that default,
    so in a training run the distribution tokens are drawn from is always the config's."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(None, ge=0.0, description="0 is greedy.")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="-1 (or 0) is no top-k cut.")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    harness_params: Literal["override", "refuse"] = Field(
        "override",
        description="a harness value that differs from a field set here: override (send the "
        "run's; counted as sampling_overridden, the harness's value kept in the trace record's "
        "meta) or refuse (400 in the client's dialect, naming the parameter)",
    )


class ProxyConfig(PoolConfig):
    """Everything ``gyre proxy`` and :class:`gyre.proxy.runner.ProxyServer` need."""

    model_dir: str = Field(
        description="HF model directory; its tokenizer and chat template render requests."
    )
    engines: list[str] = Field(
        default_factory=list, description="Engine base URLs (SGLang /generate protocol)."
    )
    host: str = "127.0.0.1"
    port: int = 0
    trace_dir: str = Field(
        "traces", description="Per-execution JSONL traces land here (gyre.trace.store)."
    )
    mode: Literal["open", "managed"] = Field(
        "open",
        description="open: any API key names its own execution; managed: only registered keys.",
    )
    admin_token: str | None = Field(
        None,
        description="Bearer token for /admin/* routes (managed: generated if absent). Never put "
        "it on a command line or in an environment a harness inherits; `gyre proxy` reads it "
        "from --admin-token-file.",
    )
    admin_socket: str | None = Field(
        None,
        description="Unix socket the admin routes listen on (mode 0600, in a 0700 directory); "
        "None: a fresh private directory under the system temp dir. The API port never serves "
        "admin routes.",
    )
    served_model_name: str | None = Field(
        None, description="Name listed by /v1/models (default: directory name)."
    )
    parser: str = Field(
        "hermes",
        description="Output parser: hermes (<tool_call>{json}</tool_call>, <think>), bash "
        "(fenced bash blocks as run_command calls) or plain.",
    )
    max_context_tokens: int | None = Field(
        None,
        description="Prompt+output token limit; default: the model config's max_position_embeddings.",
    )
    default_max_tokens: int = Field(
        2048, description="Output budget when the request does not say."
    )
    max_body_bytes: int = Field(
        64 << 20,
        description="Largest accepted request body (413 above). 64 MiB: a 500K-token agent "
        "transcript is 2-4 MB of JSON and Anthropic's own API caps a request at 32 MB (base64 "
        "images included), so no real request comes near it, while one refused body costs the "
        "proxy a few times its size at most.",
    )
    template_time_limit_s: float = Field(
        10.0,
        gt=0.0,
        description="Longest one chat-template render may take (a model folder's template is a "
        "program: a loop bomb in it is cut off here). Past it: a 400 for the request; at start "
        "`gyre proxy` refuses the model.",
    )
    max_tools: int = Field(
        512,
        ge=1,
        description="Most tools one request may define (400 above): every tool is rendered into "
        "the prompt; agents offer tens.",
    )
    fsync: bool = Field(
        True, description="fsync each trace record before answering (no call lost on a crash)."
    )
    retry_window: int = Field(
        4, description="Recent requests per execution kept to coalesce/replay SDK retries."
    )
    prefix_cache_nodes: int = Field(
        4, description="Per execution, calls whose full token JSON is kept hot."
    )
    verify_bridge: bool = Field(
        False,
        description="Debug: also fully re-render bridged requests and count "
        "differences (costs O(context) per call).",
    )
    max_open_traces: int = Field(
        128, description="Trace files kept open at once (least recently used closed first)."
    )
    max_executions: int = Field(
        1024,
        description="Execution states (bridge cache, recent bodies) kept in memory; the least "
        "recently used idle one is dropped above this (its next call is rendered in full).",
    )
    max_held_body_bytes: int = Field(
        512 << 20,
        ge=0,
        description="Request bodies and raw messages the execution states keep in all, to parse "
        "the next body incrementally and compare histories cheaply (continuation itself needs "
        "only token ids); past it the least recently used executions drop theirs (same tokens, "
        "more CPU for their next call). 512 MiB: the newest body of ~128 executions at 500K "
        "tokens of context.",
    )
    execution_idle_s: float = Field(
        600.0, description="An execution unused this long has its state dropped, trace closed."
    )
    max_client_connections: int = Field(
        4096,
        ge=16,
        description="Client connections open at once on the API port; one past it is closed at "
        "once (never an accept failing for want of file descriptors, which locked every other "
        "client out). Also held below the process's file limit, raised to its hard limit at start.",
    )
    client_read_timeout_s: float = Field(
        60.0,
        description="A client that leaves a request incomplete (headers or body) this long "
        "without sending a byte is disconnected, and one whose request headers are not complete "
        "this long after their first byte (a slowloris, trickling header lines).",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig,
        description="The run's temperature/top-p/top-k/min-p and the rule for a harness's own.",
    )
