#!/usr/bin/env bash
# Docs stage: checks that the errors page is what tools/errors_page.py writes from the refusal
# registry and that the API reference renders every public name (tools/api_reference.py; its
# index links each name to its entry, so the strict build fails on one not rendered), then
# builds the manual and its API reference (mkdocs.yml, docs/) with `mkdocs build --strict`, so a warning (a broken link or anchor, a docstring griffe cannot
# read) fails the build. Installs the `docs` extra's packages (pyproject.toml) in its own venv;
# the package itself is read from the sources (mkdocstrings/griffe, no import; the errors page
# generator reads them with ast), so neither the kernel nor MPI is needed.
#
#   .ci/docs.sh                        # builds into site/
#   DOCS_VENV=/tmp/docs .ci/docs.sh    # reuse a venv between runs
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${DOCS_VENV:-$(mktemp -d)/docs}
if [ ! -x "$VENV/bin/mkdocs" ]; then
  # The docs extra, read from pyproject.toml (one list of versions).
  mapfile -t REQS < <(python3 - <<'PY'
try:
    import tomllib
    extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
    print("\n".join(extras.get("docs", [])))
except ImportError:  # Python < 3.11: the extra is one line, `docs = ["...", ...]`
    import re
    m = re.search(r'^docs\s*=\s*\[(.*)\]\s*$', open("pyproject.toml").read(), re.M)
    print("\n".join(re.findall(r'"([^"]+)"', m.group(1))) if m else "")
PY
)
  [ "${#REQS[@]}" -gt 0 ] && [ -n "${REQS[0]}" ] || { echo "!! no docs extra in pyproject.toml"; exit 1; }
  python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQS[@]}" \
    || { echo "!! could not install the docs packages: ${REQS[*]}"; exit 1; }
fi
echo "== errors page (tools/errors_page.py --check: every refusal code of the registry, current)"
python3 tools/errors_page.py --check || { echo "== docs FAILED"; exit 1; }
echo "== API reference (tools/api_reference.py --check: every public name has its entry, the index current)"
python3 tools/api_reference.py --check || { echo "== docs FAILED"; exit 1; }
echo "== mkdocs build --strict"
if NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --site-dir "${DOCS_SITE:-site}"; then
  echo "== docs passed"
else
  echo "== docs FAILED"; exit 1
fi
