"""The documentation's Python snippets run as written (each in a fresh interpreter),
and its relative links resolve.

Pages: README.md and docs/*.md (not docs/experiments/, whose reports hold no
snippets to run). A block fenced ```python must run from the repository root and
print its result; a block not meant to run is fenced ```text, ```sh or ```bash.
"""

import glob
import os
import re
import subprocess
import sys
import unicodedata

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FENCED = re.compile(r'^```.*?^```[ \t]*$', flags=re.S | re.M)
_SNIPPET = re.compile(r'^```python\n(.*?)^```[ \t]*$', flags=re.S | re.M)
_INLINE_CODE = re.compile(r'(`+).+?\1', flags=re.S)
_LINK = re.compile(r'\]\(([^()\s]+)(?:\s+"[^"]*")?\)')
_HEADING = re.compile(r'^#{1,6}[ \t]+(.+?)[ \t#]*$', flags=re.M)
_HTML_ID = re.compile(r'<a\s+(?:id|name)="([^"]+)"')


def _pages():
  """README.md and docs/*.md, as paths relative to the repository root."""
  docs = sorted(os.path.relpath(p, _REPO) for p in glob.glob(os.path.join(_REPO, 'docs', '*.md')))
  return ['README.md'] + docs


def _read(page):
  with open(os.path.join(_REPO, page), encoding='utf-8') as f:
    return f.read()


def _snippets(page):
  return _SNIPPET.findall(_read(page))


def _all_snippets():
  return [(page, index) for page in _pages() for index in range(len(_snippets(page)))]


def _unique_snippets():
  """`_all_snippets` with each text once, at the first page and index where it appears (a
  snippet copied onto several pages runs once: the same text runs the same)."""
  first = {}
  for page, index in _all_snippets():
    first.setdefault(_snippets(page)[index], (page, index))
  return list(first.values())


def test_readme_has_snippets():
  assert len(_snippets('README.md')) >= 2


@pytest.mark.parametrize('page,index', _unique_snippets())
@pytest.mark.slow
def test_snippet_runs(page, index, tmp_path):
  code = re.sub(
    r"'/tmp/(my_\w+)'", lambda m: repr(str(tmp_path / m.group(1))), _snippets(page)[index]
  )
  proc = subprocess.run(
    [sys.executable, '-c', code], cwd=_REPO, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, f'{page} snippet {index}:\n' + proc.stderr[-3000:]
  assert proc.stdout.strip(), f'{page} snippet {index} prints its result'
  # Quiet as a library: none of the multi-line reports TFF's secure sums leave behind.
  assert 'Object was never used' not in proc.stderr, f'{page} snippet {index}'
  assert 'ERROR:tensorflow' not in proc.stderr, f'{page} snippet {index}:\n' + proc.stderr[-3000:]


def _slug(heading):
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r'<[^>]+>', '', heading)
  text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)  # A link's text.
  kept = []
  for char in text.lower():
    if char in ' -_' or unicodedata.category(char)[0] in 'LMN':
      kept.append(char)
  return ''.join(kept).replace(' ', '-')


def _anchors(path):
  text = _read(path)
  anchors = set(_HTML_ID.findall(text))
  seen = {}
  for heading in _HEADING.findall(_FENCED.sub('', text)):
    slug = _slug(heading)
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else f'{slug}-{count}')
  return anchors


def _links(page):
  """The link targets of `page` outside code blocks and inline code."""
  text = _INLINE_CODE.sub('', _FENCED.sub('', _read(page)))
  return _LINK.findall(text)


def test_links_resolve():
  broken = []
  for page in _pages():
    for target in _links(page):
      if re.match(r'[a-z][a-z0-9+.-]*:', target, flags=re.I):  # http(s), mailto, …
        continue
      path, _, anchor = target.partition('#')
      resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
      if not os.path.exists(os.path.join(_REPO, resolved)):
        broken.append(f'{page}: {target} (no file {resolved})')
      elif anchor and resolved.endswith('.md') and anchor not in _anchors(resolved):
        broken.append(f'{page}: {target} (no anchor #{anchor} in {resolved})')
  assert not broken, '\n'.join(broken)


def test_links_are_found():
  """The link check sees the README's links (guards the regular expressions)."""
  targets = _links('README.md')
  assert 'docs/algorithms.md' in targets
  assert any(t.startswith('docs/optimal_sampling.md#') for t in targets)


_INTERVAL = re.compile(r'([+−-]?\d+(?:\.\d+)?) \[([+−-]?\d+(?:\.\d+)?), ([+−-]?\d+(?:\.\d+)?)\]')


def _numbers(match):
  return [float(x.replace('−', '-')) for x in match.groups()]


def _decimals(text):
  return len(text.partition('.')[2])


_VERDICT_WORDS = ('reproduced', 'contradicted', 'no difference detected', 'undecided')
_BOLD_VERDICT = re.compile(r'\*\*(' + '|'.join(_VERDICT_WORDS) + r')\*\*', re.IGNORECASE)


def _report_intervals(page):
  """The `difference [95% CI]` cells of every results.md the experiment page links to, or
  that sits beside it (``<page>/results.md``), each with the verdict words of its line
  (the verdict and the Holm-adjusted one)."""
  folder = os.path.dirname(os.path.join(_REPO, page))
  linked = set(re.findall(r'\(([\w.\-]+)/results\.md\)', _read(page)))
  own = os.path.splitext(os.path.basename(page))[0]
  linked |= {own} if os.path.exists(os.path.join(folder, own, 'results.md')) else set()
  intervals = []
  for name in sorted(linked):
    report = _read(os.path.relpath(os.path.join(folder, name, 'results.md'), _REPO))
    for line in report.splitlines():
      words = {w for w in _VERDICT_WORDS if w in line}
      intervals += [(_numbers(m), words) for m in _INTERVAL.finditer(line)]
  return intervals


def _readme_verdict_rows():
  table = _read('README.md').split("| experiment | paper's claim | verdict", 1)[1].split('\n\n')[0]
  for row in table.splitlines()[2:]:
    page = re.search(r'\]\((docs/experiments/[\w.\-]+\.md)', row).group(1)
    yield page, row.rsplit(' | ', 1)[-1]


def _quoted_in(match, intervals):
  """The verdict words of the report lines whose interval `match` quotes at its rounding."""
  quoted = _numbers(match)
  tolerance = 0.5 * 10.0 ** -min(_decimals(x) for x in match.groups()) + 1e-9
  return [
    words for src, words in intervals if all(abs(q - s) <= tolerance for q, s in zip(quoted, src))
  ]


def test_the_readme_verdicts_quote_the_reports():
  """Every interval in the README's verdict table is one of its experiment's results.md,
  rounded as the README prints it, and the bold verdict word before it (if any) is that
  line's verdict or its Holm-adjusted one: neither can drift from its source."""
  checked, worded, missing = 0, 0, []
  for page, cell in _readme_verdict_rows():
    sources = _report_intervals(page)
    for match in _INTERVAL.finditer(cell):
      found = _quoted_in(match, sources)
      checked += 1
      if not found:
        missing.append(f'{page}: {match.group(0)}')
      said = list(_BOLD_VERDICT.finditer(cell[: match.start()]))
      if said and found:
        worded += 1
        word = said[-1].group(1).lower()
        if not any(word in words for words in found):
          missing.append(f'{page}: **{word}** before {match.group(0)}, the report: {found}')
  assert checked >= 20 and worded >= 20, (checked, worded)
  assert not missing, 'README verdicts not in the reports: ' + '; '.join(missing)
