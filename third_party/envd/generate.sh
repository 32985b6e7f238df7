#!/bin/sh
# Regenerates the Go code for envd's Connect RPC services from E2B's own
# .proto files (proto/, taken unchanged from e2b-dev/E2B spec/envd at
# commit b8029973a; Apache-2.0, see LICENSE). Needs protoc (Debian's
# protobuf-compiler) and, on PATH:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
set -eu
cd "$(dirname "$0")"
m=sandstorm/third_party/envd
map="Mprocess/process.proto=$m/process,Mfilesystem/filesystem.proto=$m/filesystem"
protoc -I proto -I /usr/include \
	--go_out=. --go_opt=module=$m --go_opt=$map \
	--connect-go_out=. --connect-go_opt=module=$m --connect-go_opt=$map \
	process/process.proto filesystem/filesystem.proto
