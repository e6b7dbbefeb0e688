#!/usr/bin/env bash
# Gyre verifier: run the hidden tests against the workspace copy; pytest writes
# junit.xml, from which the scorer takes passed/total (see docs/harness.md).
cd "$GYRE_WORKSPACE" || exit 2
# Third-party pytest plugins of the host are not needed and cost seconds per run.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
# The workspace is the harness's: it goes on sys.path only once pytest has loaded (-o
# pythonpath), never first (PYTHONSAFEPATH: `-m` does not put the cwd first), so a pytest.py
# left in the workspace is not run as the verifier.
export PYTHONSAFEPATH=1
python -m pytest -q -p no:cacheprovider --rootdir "$GYRE_TESTS_DIR" -o pythonpath="$GYRE_WORKSPACE" \
  --junitxml "$GYRE_REWARD_DIR/junit.xml" "$GYRE_TESTS_DIR"
# pytest's exit status (tests failed) is not an error of the verifier.
exit 0
