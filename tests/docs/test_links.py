"""Every relative link in README.md and docs/*.md points to a file that exists, and every
anchor (``page.md#heading``, ``#heading``) to a heading of that page."""

from __future__ import annotations

import pytest

from tests.docs import markdown
from tests.docs.markdown import REPO

PAGES = markdown.pages()


@pytest.mark.parametrize("page", PAGES, ids=[markdown.name(p) for p in PAGES])
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for line, target in markdown.links(page):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{markdown.name(page)}:{line}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in markdown.anchors(file.read_text()):
            broken.append(f"{markdown.name(page)}:{line}: {target} (no heading with anchor #{anchor} in {file.relative_to(REPO)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme_and_the_index():
    for index in (REPO / "README.md", REPO / "docs/README.md"):
        targets = {(index.parent / target.partition("#")[0]).resolve() for _, target in markdown.links(index)}
        missing = [markdown.name(page) for page in PAGES[1:] if page.resolve() not in targets and page != index]
        assert not missing, f"{markdown.name(index)} does not link {missing}"


def test_anchors_follow_githubs_rules():
    text = "# Data: TFRecord shards\n## Debugging hooks in `hooks/`\n## Notes\n## Notes\n```\n# not a heading\n```\n"
    assert markdown.anchors(text) == {"data-tfrecord-shards", "debugging-hooks-in-hooks", "notes", "notes-1"}
