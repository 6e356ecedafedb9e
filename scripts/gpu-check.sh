#!/usr/bin/env bash
d="$(dirname "${BASH_SOURCE[0]}")/gpu/tests"; exec "${PYTHON:-python3}" -m pytest -c "$d/pytest.ini" --rootdir "$d" "$d" "$@"
