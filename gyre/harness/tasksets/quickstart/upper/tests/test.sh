#!/usr/bin/env bash
# Quickstart verifier: graded reward from answer.txt (see score.py).
python "$GYRE_TESTS_DIR/score.py" upper
