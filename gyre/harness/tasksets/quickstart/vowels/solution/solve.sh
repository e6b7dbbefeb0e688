#!/usr/bin/env bash
printf '%s\n' 'aeiou' > answer.txt
