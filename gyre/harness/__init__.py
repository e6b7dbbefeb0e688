"""Running black-box harnesses: task sets, workspaces, timeouts, sandbox, scoring.

Import from the submodules (``gyre.harness.executor``, ``.execution``, ``.task``,
``.profiles``, ``.scorer``; assessments are ``gyre.trace.assessment``); this package file
stays empty so harness processes that run ``python -m gyre.harness.<x>`` start fast.
"""
