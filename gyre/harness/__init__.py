"""Running black-box harnesses: task sets, workspaces, timeouts, sandbox, scoring.

Import from the submodules (``gyre.harness.executor``, ``.task``, ``.profiles``,
``.assessment``, ``.scorer``); this package file stays empty so harness
processes that run ``python -m gyre.harness.<x>`` start fast.
"""
