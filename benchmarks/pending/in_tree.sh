#!/usr/bin/env bash
# in_tree.sh DIR CMD...: CMD run in DIR (python3 -m then imports DIR/dsv4kit first)
cd "$1" && shift && exec "$@"
