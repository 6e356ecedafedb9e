#!/usr/bin/env bash
exec "${PYTHON:-python3}" -m pytest "$(dirname "${BASH_SOURCE[0]}")/gpu/tests" "$@"
