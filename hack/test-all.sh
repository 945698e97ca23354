#!/usr/bin/env bash
# make test: runs every suite, each a make target (test-unit test-examples test-e2e test-chaos), to the end
# even when an earlier one fails, so a red unit suite does not hide the e2e result. Prints each
# suite's output as it comes, then a summary with the packages that failed, and a last line
# "N passed, M failed"; exits non-zero when any suite failed.
#
#	hack/test-all.sh test-unit test-examples test-e2e test-chaos
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

make=${MAKE:-make}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# Ctrl-C stops the whole run, not just the suite it is in.
trap 'exit 130' INT TERM

duration() { # duration SECONDS: 75 -> 1m15s
	if (($1 >= 60)); then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi
}

suites=("$@")
results=() times=() failed_pkgs=()
passed=0 failed=0
for suite in "${suites[@]}"; do
	printf '\n=== %s\n' "$suite"
	start=$SECONDS
	# stdout goes through tee so the summary can name the packages that failed; stderr is left alone.
	if "$make" --no-print-directory "$suite" | tee "$logs/$suite.log"; then
		results+=(ok) passed=$((passed + 1))
	else
		results+=(FAIL) failed=$((failed + 1))
	fi
	times+=("$(duration $((SECONDS - start)))")
	# go test prints "FAIL<tab><package><tab><time>" (or "[build failed]") for each failed package.
	failed_pkgs+=("$(awk '$1 == "FAIL" && NF >= 2 { printf "%s%s", sep, $2; sep = " " }' "$logs/$suite.log")")
done

printf '\n=== Summary\n'
printf '%-12s %-6s %-8s %s\n' SUITE RESULT TIME "FAILED PACKAGES"
for i in "${!suites[@]}"; do
	printf '%-12s %-6s %-8s %s' "${suites[$i]}" "${results[$i]}" "${times[$i]}" "${failed_pkgs[$i]}" | sed 's/ *$//'
	echo
done
echo "$passed passed, $failed failed"
((failed == 0))
