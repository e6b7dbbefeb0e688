#!/usr/bin/env bash
# Quickstart verifier: graded reward from answer.txt (see score.py).
exec python -I -S "$GYRE_TESTS_DIR/score.py" letter-a
