"""How a call's prompt is built, and the sampling it is sent with.

The bridge (:meth:`gyre.proxy.session.ExecutionState.find_bridge`) names the recorded call
a request extends; the planner turns it into a :class:`~gyre.proxy.session.Plan`: a
token-exact continuation (only the new messages rendered), a resample of the same prompt,
or a full render when the template cannot render the anchor as a prefix or nothing
matched. ``verify_bridge`` re-renders every continuation in full and counts mismatches.
The engine sampling is the harness's request under the run's fixed fields
(:mod:`gyre.proxy.sampling`), capped by the room left in the context.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from gyre.proxy import jsonfast
from gyre.proxy.adapters.dialects import Adapter, too_long
from gyre.proxy.config import ProxyConfig
from gyre.proxy.counters import BridgeMode, ProxyCounters
from gyre.proxy.errors import bad_request
from gyre.proxy.render import Renderer, RenderError
from gyre.proxy.sampling import SamplingRefused, effective, engine_sampling
from gyre.proxy.session import Bridge, ExecutionState, Plan
from gyre.proxy.types import ParsedCall


class Planner:
    def __init__(
        self,
        config: ProxyConfig,
        renderer: Renderer,
        max_context: int,
        counters: ProxyCounters,
    ) -> None:
        self.config = config
        self.renderer = renderer
        self.max_context = max_context
        self.counters = counters

    async def plan(self, st: ExecutionState, call: ParsedCall) -> Plan:
        rid = uuid.uuid4().hex[:24]
        bridge = st.find_bridge(call)
        suffix: list[int] | None = None
        mode: BridgeMode = "full"
        try:
            if bridge.base is not None and bridge.echo is not None:
                last = bridge.base.output[-1] if bridge.base.output else None
                suffix = self.renderer.continuation(
                    bridge.head, bridge.base.assistant, bridge.new, call.tools, last
                )
                mode = "continuation"
                if suffix is None:  # the template does not render the anchor as a prefix
                    mode = "template_fallback"
                    bridge = Bridge(
                        base=None,
                        base_len=0,
                        echo=None,
                        new=bridge.norm,
                        norm=bridge.norm,
                        raw_to_norm=bridge.raw_to_norm,
                        head=bridge.head,
                    )
            elif bridge.base is not None:
                suffix, mode = [], "resample"
            if suffix is None:
                suffix = await asyncio.to_thread(self.renderer.full, bridge.norm, call.tools)
        except RenderError as e:
            raise bad_request(
                f"the model's chat template cannot render this conversation: {e}"
            ) from None
        parts = st.prefix_parts(bridge.base, bridge.base_len)
        if suffix:
            parts = parts + [jsonfast.ids_json(suffix)]
        plan = Plan(
            request_id=rid,
            bridge=bridge,
            suffix=suffix,
            input_parts=parts,
            input_len=bridge.base_len + len(suffix),
            mode=mode,
        )
        if self.config.verify_bridge and mode == "continuation":
            assert bridge.base is not None  # a continuation extends a recorded call
            full = await asyncio.to_thread(self.renderer.full, bridge.norm, call.tools)
            plan.verify_equal = full == bridge.base.materialise(bridge.base_len) + suffix
            if not plan.verify_equal:
                self.counters.bridge_mismatch += 1
        return plan

    def sampling(self, call: ParsedCall, input_len: int, adapter: Adapter) -> dict[str, Any]:
        if input_len <= 0:
            raise bad_request("the rendered prompt is empty")
        room = self.max_context - input_len
        if room <= 0:
            raise too_long(adapter, str(input_len), self.max_context)
        s = call.sampling
        sp: dict[str, Any] = {
            "max_new_tokens": min(s.max_tokens or self.config.default_max_tokens, room),
            "stop_token_ids": self.renderer.stop_token_ids,
        }
        try:  # the run's fixed fields win over the harness's (gyre.proxy.sampling)
            dist, overridden = engine_sampling(s, self.config.sampling)
        except SamplingRefused as e:
            raise bad_request(str(e), param=e.param) from None
        sp.update(dist)
        call.meta["sampling"] = effective(dist)
        if overridden:
            call.meta["sampling_overridden"] = overridden
            self.counters.sampling_overridden += 1
        if s.seed is not None:
            sp["sampling_seed"] = s.seed  # SGLang's name; Gyre engines accept it too
        return sp
