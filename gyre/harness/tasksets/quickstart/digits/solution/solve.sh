#!/usr/bin/env bash
printf '%s\n' '12345' > answer.txt
