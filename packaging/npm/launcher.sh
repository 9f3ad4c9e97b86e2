#!/bin/sh
# coda-shim's @COMMAND@ until install.js replaces this file with the native binary (it does not run with
# --ignore-scripts, nor under pnpm or bun by default). Finds this platform's binary in the package
# @coda-shim/<platform> beside or below coda-shim and execs it: the process becomes the binary itself, with
# the same pid, process group and signals. scripts/npm-pack writes one copy per command.
command=@COMMAND@

# This file's real folder: npm's command is a symbolic link to it.
self=$0
while [ -h "$self" ]; do
  link=$(readlink "$self")
  case $link in
    /*) self=$link ;;
    *) self=${self%/*}/$link ;;
  esac
done
package=$(cd "${self%/*}/.." && pwd -P) || exit 127

case $(uname -s) in
  Darwin) os=darwin ;;
  Linux) os=linux ;;
  *) os=$(uname -s | tr '[:upper:]' '[:lower:]') ;;
esac
case $(uname -m) in
  arm64 | aarch64) cpu=arm64 ;;
  x86_64 | amd64) cpu=x64 ;;
  *) cpu=$(uname -m) ;;
esac
# A shell under Rosetta says x86_64 on an Apple silicon Mac, where npm's arm64 Node picked darwin-arm64.
if [ "$os-$cpu" = darwin-x64 ] && [ "$(sysctl -n sysctl.proc_translated 2>/dev/null)" = 1 ]; then
  cpu=arm64
fi
platform=$os-$cpu

# npm puts the package under coda-shim (a global install) or beside it (a project's node_modules); pnpm
# beside it in its store. Node's own lookup: node_modules of this folder and of every folder above it.
dir=$package
while :; do
  binary=$dir/node_modules/@coda-shim/$platform/bin/$command
  if [ -f "$binary" ] && [ -x "$binary" ]; then
    exec "$binary" "$@"
  fi
  [ "$dir" = / ] && break
  dir=$(dirname "$dir")
done

case $platform in
  darwin-arm64 | darwin-x64 | linux-arm64 | linux-x64)
    echo "coda-shim: no $command binary for this platform ($platform): the package @coda-shim/$platform is not installed with coda-shim ($package)." >&2
    echo "coda-shim: npm installs it unless optional dependencies are left out (--omit=optional, --no-optional, omit=optional in .npmrc, a package-lock.json made on another platform); install coda-shim again with them (npm install -g coda-shim)" >&2
    ;;
  *)
    echo "coda-shim: no binaries for this platform ($platform); there are packages for darwin-arm64, darwin-x64, linux-arm64 and linux-x64." >&2
    echo "coda-shim: build it from source instead: cargo install --locked --git <repository URL> coda-shim" >&2
    ;;
esac
exit 127
