#!/bin/sh
echo "coverage tools are not available in this offline Bazel setup (bazel/shims)" >&2
exit 1
