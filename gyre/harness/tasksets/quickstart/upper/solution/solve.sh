#!/usr/bin/env bash
printf '%s\n' 'YES' > answer.txt
