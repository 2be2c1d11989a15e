#!/bin/sh
# Builds sdk/go/vendor from the Go sources Debian installs in /usr/share/gocode (golang-google-grpc-dev,
# golang-google-protobuf-dev and their dependencies), for machines without a Go module proxy: `go` then
# builds the module offline (-mod=vendor is the default while vendor/ exists). vendor/ is not committed;
# elsewhere `go` fetches the versions go.mod names. Each module of go.mod becomes a symlink to Debian's
# tree, and vendor/modules.txt lists them as go.mod does, which is what `go` checks vendor/ against.
set -eu
cd "$(dirname "$0")/.."
src=${GOCODE:-/usr/share/gocode}/src
[ -d "$src/google.golang.org/grpc" ] || { echo "no Go sources in $src (apt-get install golang-google-grpc-dev)" >&2; exit 1; }
rm -rf vendor.part
mkdir vendor.part
sed -n 's/^\t\([^ ]*\) \(v[^ ]*\).*/\1 \2/p' go.mod | while read -r module version; do
	[ -d "$src/$module" ] || { echo "Debian has no $module in $src" >&2; exit 1; }
	mkdir -p "vendor.part/$(dirname "$module")"
	ln -s "$src/$module" "vendor.part/$module"
	printf '# %s %s\n## explicit\n' "$module" "$version" >> vendor.part/modules.txt
done
rm -rf vendor
mv vendor.part vendor
