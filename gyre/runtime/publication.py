"""Is every engine serving the weights the core published? Checked after each publication.

The core returns the fingerprints of the weights it wrote (:mod:`gyre.engine.checksum`, one
per dtype an engine may hold them in); each engine reports the fingerprint of what it holds
in memory after the reload (``weights_checksum`` in its reload response and model info). A
difference means the engine would sample the next burst from weights nobody trains, and
every trace it records would carry a version that lies: the run stops with one line naming
the engine. Engines that report no fingerprint (vLLM, SGLang) are not checked; the count of
checked engines is in each publication's record.
"""

from __future__ import annotations

from gyre.engine.protocol import ModelInfo, UpdateWeightsResponse


class PublicationError(RuntimeError):
    """An engine does not serve the weights the core published (the run cannot go on)."""


def check_served(
    engine: str,
    version: int,
    reply: UpdateWeightsResponse | ModelInfo,
    published: dict[str, float],
) -> bool:
    """Raise :class:`PublicationError` if ``engine``'s ``reply`` shows other weights than the
    core's ``published`` fingerprints of ``version``; ``False`` if it cannot tell (no
    fingerprint reported), ``True`` if checked and equal."""
    if reply.weight_version is not None and str(reply.weight_version) != str(version):
        raise PublicationError(
            f"{engine} reports weights version {reply.weight_version} after the publication of "
            f"version {version}; stopping the run"
        )
    got, dtype = reply.weights_checksum, reply.weights_dtype or "float32"
    want = published.get(dtype)
    if got is None or want is None:
        return False
    if got != want:
        raise PublicationError(
            f"{engine} does not serve the published weights of version {version} "
            f"({dtype} checksum {got!r}, the core's {want!r}); stopping the run"
        )
    return True
