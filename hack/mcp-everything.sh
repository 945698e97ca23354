#!/usr/bin/env bash
# Installs the MCP reference server @modelcontextprotocol/server-everything with npm into a cache
# directory (once; a second call is instant) and prints the path of its runnable entry point, so
# tests can start it with: PORT=<port> node <entry> streamableHttp
#
# The version is pinned so a new upstream release cannot change test behaviour under us; bump it
# deliberately (npm view @modelcontextprotocol/server-everything version).
set -euo pipefail

version=${MCP_EVERYTHING_VERSION:-2026.8.31}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/toolnexus/npm/server-everything-$version
pkg="$cache/node_modules/@modelcontextprotocol/server-everything"

entry() { # prints the package's bin entry (an absolute path) or fails
	node -e '
		const dir = process.argv[1];
		const pkg = require(dir + "/package.json");
		const bin = typeof pkg.bin === "string" ? pkg.bin : Object.values(pkg.bin || {})[0];
		if (!bin) process.exit(1);
		console.log(require("path").resolve(dir, bin));
	' "$pkg"
}

if [ -f "$pkg/package.json" ] && out=$(entry 2>/dev/null) && [ -f "$out" ]; then
	echo "$out"
	exit 0
fi

command -v npm >/dev/null || { echo "npm is not on PATH; install Node.js 20+ to run the MCP reference server" >&2; exit 127; }
echo "installing @modelcontextprotocol/server-everything@$version into $cache (once)" >&2
mkdir -p "$cache"
# A private prefix keeps the install out of the repository and away from global node_modules.
npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
	"@modelcontextprotocol/server-everything@$version" >&2
entry
