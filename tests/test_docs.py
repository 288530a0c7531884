"""The repository speaks of the product: no words of how it was built.

Scans the package, its data, the docs, the README and CHANGELOG, the examples, the tests and the
benchmarks for words that describe the development process instead of the product: issue numbers,
"session", branch names, "the lead", numbered passes ("Second pass"), worktree and machine paths,
and commit hashes of this repository. Commit hashes of *other* projects are citations and stay:
a hexadecimal token counts as such a citation only when it is a commit ``CITED_COMMITS`` files
under the ``owner/name`` of its repository, or when an ``owner/name`` of a known upstream
repository (or a GitHub URL) stands on its line or on one of the three lines before it; and,
where this checkout has its git history, only when it is not a commit of this repository.

Every finding is reported as ``path:line: what: the line``.
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["ccoverlap", "docs", "examples", "tests", "benchmarks", "README.md", "CHANGELOG.md", "Makefile"]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".json", ".txt", ".sh", ".csv", ".cfg", ".ini", ""}
SELF = Path(__file__).resolve()

# (what, pattern); matched case-insensitively, line by line.
PROCESS_WORDS = [
    ("issue number", r"\bissues?[- ]?#?\d+"),
    ("the issue", r"\b(?:the|this) issue(?:'s)?\b"),
    ("session", r"\bsessions?\b"),
    ("the lead", r"\bthe lead(?:'s)?\b"),
    ("numbered pass", r"\b(?:first|second|third|fourth|fifth|2nd|3rd|4th|5th|this|previous|earlier) pass\b"),
    ("branch", r"\bbranch(?:es|ed)?\b(?![- ]and[- ]bound)"),
    ("worktree", r"\bwork-?trees?\b"),
    ("machine path", r"/work/|/home/\w|/root/"),
    ("branch name", r"`(?:acc|acc-comm|acc-compute|asynctp|ttp|mbridge|speed-plan|speed-sim|search-more|plan2|sim2)`"),
]
# Legitimate uses of a word above, removed from a line before it is checked.
ALLOWED = [
    r"""scope=["']session["']""",  # pytest's fixture scope
]

HEX = re.compile(r"(?<![\w.#/-])([0-9a-f]{7,40})(?![\w])")
# Upstream repositories whose commits the data files and docs cite.
UPSTREAM_OWNERS = (
    "pytorch", "NVIDIA", "NVIDIA-NeMo", "openxla", "foundation-model-stack", "facebookresearch",
    "microsoft", "deepspeedai", "meta-llama", "ROCm", "huggingface", "stas00",
)
# The upstream commits the package's data, docs and benchmarks cite, by repository. A new citation
# either names its repository next to the hash or gets a line here.
CITED_COMMITS = {
    "NVIDIA/Megatron-LM": ("f2e5db402c", "50a4b5fa02", "e6d7e09"),
    "NVIDIA-NeMo/Megatron-Bridge": ("067f987df03b8355b03192d88d70f1709fedf51a",
                                    "97ad8cc6fb27a58bb79ff51ce73897c3887aa2c6",
                                    "21d102f5ecbaa9307bb7eb0a9b0850cdf2f4bbd6"),
    "pytorch/torchtitan": ("d4c86e375", "eaea6f6a2", "1ea476e9f", "9dec370", "004b3148a"),
    "pytorch/pytorch": ("1963fc8", "00ae0bc9"),
    "lessizzmore/create-a3mega-ztan-fork": ("02dd8f455c43ced1cf442ef29334bda97149264b",),
    "pytorch/ao": ("46b879641", "0e0fba8f"),
    "foundation-model-stack/fms-fsdp": ("0d319983c4",),
    "openxla/xla": ("71feeddf7cc3c9c7878eee18ea43c983631e6e84",),
    "aws-ia/terraform-aws-eks-blueprints": ("0426f2b931b66214634386896cb170d0bf68cdb9",),
    "aws-samples/aws-efa-eks": ("043dbe748fad5c4a6842cd2135c097fbaafe4a95",),
    "Azure/AI-benchmarking-guide": ("f350e7e65b82cfcb9220b32b582bc34342d9c1a6",
                                    "3bb66cacc25632d8ece36bc1d5128c5ea886a60b"),
    "NVIDIA/dgxc-benchmarking": ("841f5466cd86b66abd48049e839c563776f6d716",
                                 "8e77d607c06f8c8603568ba7e49e65f8ff88c1b8"),
    "xxrjun/nccl-tests-cluster": ("455de4f8dee2fa94cd4044a7109fd8c576f9e6c1",
                                  "56089cacb75b9a7ace5065cc9754b2a4ec53467d"),
}
REPO_REF = re.compile(r"github\.com/|\b(?:" + "|".join(UPSTREAM_OWNERS) + r")/[A-Za-z0-9_.-]+")
CONTEXT_LINES = 3


def scanned_files() -> list[Path]:
    """Every text file under the scanned roots (git's ignored build outputs excluded)."""
    files = []
    for name in SCANNED:
        p = ROOT / name
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                if (f.is_file() and f.suffix in TEXT_SUFFIXES and "__pycache__" not in f.parts
                        and not any(part.endswith(".egg-info") for part in f.parts)):
                    files.append(f)
    return [f for f in files if f.resolve() != SELF]


@lru_cache(maxsize=1)
def own_commits() -> tuple[str, ...]:
    """This repository's commit hashes, or () where the checkout has no git history."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--all"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(out.split())


def cited_upstream(token: str) -> str | None:
    """The repository ``CITED_COMMITS`` files the commit ``token`` under (abbreviated or full)."""
    for repo, commits in CITED_COMMITS.items():
        if any(c.startswith(token) or token.startswith(c) for c in commits):
            return repo
    return None


def is_hash(token: str) -> bool:
    """A hexadecimal token that looks like an abbreviated commit (letters and digits, not a number)."""
    return any(c.isdigit() for c in token) and sum(c.isalpha() for c in token) >= 1 and not token.isdigit()


def hash_findings(lines: list[str], i: int) -> list[str]:
    """Commit-like tokens on line ``i`` that are not a citation of another project's commit."""
    found = []
    for m in HEX.finditer(lines[i]):
        token = m.group(1)
        rest = lines[i][m.end():m.end() + 2]
        if not is_hash(token) or (token.endswith("e") and re.match(r"[-+]\d", rest)):
            continue  # a number such as 1.55e-07
        if any(c.startswith(token) for c in own_commits()):
            found.append(f"commit of this repository {token}")
            continue
        context = "\n".join(lines[max(0, i - CONTEXT_LINES):i + 1])
        if cited_upstream(token) is None and not REPO_REF.search(context):
            found.append(f"commit hash {token} without an owner/name of the repository it belongs to")
    return found


def findings(path: Path, root: Path = ROOT) -> list[str]:
    """Every process word and internal hash in one file, as ``path:line: what: text`` (path
    relative to ``root``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    lines = text.splitlines()
    out = []
    rel = path.relative_to(root)
    for i, line in enumerate(lines):
        checked = line
        for allowed in ALLOWED:
            checked = re.sub(allowed, "", checked)
        what = [name for name, pattern in PROCESS_WORDS if re.search(pattern, checked, re.IGNORECASE)]
        what += hash_findings(lines, i)
        out += [f"{rel}:{i + 1}: {w}: {line.strip()[:160]}" for w in what]
    return out


def test_no_process_words() -> None:
    """No issue numbers, sessions, branches, leads, passes, machine paths or internal hashes."""
    problems = [p for f in scanned_files() for p in findings(f)]
    assert not problems, f"{len(problems)} process word(s):\n" + "\n".join(problems)


@pytest.mark.parametrize("line, expected", [
    ("see issue 10 for the targets", "issue number"),
    ("(issue-14, item 2)", "issue number"),
    ("the issue's 5% tolerance", "the issue"),
    ("as measured in this session", "session"),
    ("the lead re-runs the scripts", "the lead"),
    ("### Second pass: paired tune", "numbered pass"),
    ("after the `ttp` branch", "branch"),
    ("git worktree add /tmp/x", "worktree"),
    ("PYTHONPATH=/work/main python bench.py", "machine path"),
    ("modelled since `acc-comm`", "branch name"),
    ("this work started at e160fb3 (main)", "e160fb3"),
])
def test_each_pattern_catches_its_word(tmp_path, line, expected) -> None:
    """Each pattern finds the kind of line it is there for."""
    f = tmp_path / "page.md"
    f.write_text("intro\n" + line + "\n")
    got = findings(f, tmp_path)
    assert any(expected in g for g in got), got


@pytest.mark.parametrize("line", [
    "stop once the next estimate exceeds the best (branch and bound)",
    "kernel_launch_overhead_s: 1.552810007570928e-07",
    "Megatron-LM at f2e5db402c (NVIDIA/Megatron-LM, training.py)",
    "pytorch/torchtitan docs/performance.md at commit d4c86e375",
    "color #1f77b4 and 1234567 tokens",
    "@pytest.fixture(scope=\"session\")",
    "the host issues kernels in issue order",
    "groups that issue different numbers of collectives",
])
def test_legitimate_lines_pass(tmp_path, line) -> None:
    """Words that look alike but describe the product are not findings."""
    f = tmp_path / "page.md"
    f.write_text(line + "\n")
    assert findings(f, tmp_path) == []


def test_citation_context_is_the_lines_before_only(tmp_path) -> None:
    """A repository named three lines before a hash covers it; one named after it does not."""
    f = tmp_path / "page.md"
    f.write_text("source: NVIDIA/Megatron-LM README\n\n\n  at commit 5d3c2b1a0f\n")
    assert findings(f, tmp_path) == []
    f.write_text("at commit 5d3c2b1a0f\nsource: NVIDIA/Megatron-LM README\n")
    assert findings(f, tmp_path) != []


def test_cited_commits_are_upstream_and_used() -> None:
    """Every filed upstream commit is not one of this repository's and is cited somewhere."""
    text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in scanned_files())
    for repo, commits in CITED_COMMITS.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo), repo
        for c in commits:
            assert not any(own.startswith(c) for own in own_commits()), (repo, c)
            assert c[:9] in text, f"{repo} {c} is filed but cited nowhere"


def test_scan_covers_every_root() -> None:
    """The scan reads files of each root named by the check (none silently empty)."""
    files = scanned_files()
    for name in ("ccoverlap", "docs", "examples", "tests", "benchmarks"):
        assert any(f.is_relative_to(ROOT / name) for f in files), name
    assert ROOT / "README.md" in files
    assert any(f.name == "published.yaml" for f in files)



# ----------------------------------------------------------------------------- links

DOC_PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# docs/ paths that name another project's file (cited as sources), not one of ours.
UPSTREAM_DOC_PATHS = {"docs/performance.md", "docs/performance-summary-archive.md", "docs/profiling.md"}  # torchtitan, vidur


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks)."""
    out, in_code = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Relative links of a page whose file or heading does not exist (paths relative to ``root``)."""
    problems = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.relative_to(root)}: link to {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.relative_to(root)}: link to {target}: no such heading")
    return problems


def test_doc_links_resolve() -> None:
    """Every relative link of the README, the changelog and docs/ reaches a file and heading."""
    problems = [p for page in DOC_PAGES for p in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_docs_named_in_the_package_exist() -> None:
    """Every docs/ page the package, tests, benchmarks and examples point users to exists."""
    missing = []
    for f in scanned_files():
        if f.suffix not in {".py", ".yaml", ".yml", ".sh", ".toml"}:
            continue
        for name in set(re.findall(r"\bdocs/[\w.-]+\.md\b", f.read_text(encoding="utf-8", errors="replace"))):
            if name not in UPSTREAM_DOC_PATHS and not (ROOT / name).exists():
                missing.append(f"{f.relative_to(ROOT)}: {name}")
    assert not missing, "\n".join(missing)


def test_index_lists_every_page() -> None:
    """docs/index.md links every page of docs/."""
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    listed = set(LINK.findall(index))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert not pages - {t.partition("#")[0] for t in listed}, pages - listed


def test_link_check_finds_a_broken_link(tmp_path) -> None:
    """The link check reports a missing file and a missing heading."""
    (tmp_path / "a.md").write_text("# Title\n\n[x](b.md) [y](#nothing) [z](#title)\n")
    problems = broken_links(tmp_path / "a.md", tmp_path)
    assert len(problems) == 2 and "no such file" in problems[0] and "no such heading" in problems[1]
