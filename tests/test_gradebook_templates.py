"""The gradebook's pages come from Jinja2 template files with autoescaping: every value a template
shows goes through the pages' escaping (HTML, bidi controls, lone surrogates), HTML the pages
made passes as it is, and the templates ship in the package."""

import tomllib
from pathlib import Path

from txlearn.course.gradebook.pages import CSP, TEMPLATES, Raw, page, render, table

ROOT = Path(__file__).resolve().parent.parent


def test_a_templates_values_are_escaped_and_made_html_is_kept():
    html = render("table.html", header=["<i>head</i>"],
                  rows=[[Raw("<b>made here</b>"), "<script>x</script>", "a\u202eb", "Jos\udce9"]],
                  numeric={0})
    assert '<th class="num">&lt;i&gt;head&lt;/i&gt;</th>' in html
    assert '<td class="num"><b>made here</b></td>' in html
    assert "<td>&lt;script&gt;x&lt;/script&gt;</td>" in html
    assert "<td>a\\u202eb</td>" in html and "<td>Jos\\udce9</td>" in html   # written out
    assert "<script>" not in html


def test_a_page_is_its_template_with_the_policy_and_escaped_title():
    text = page('Feedback: "01" <x>', "<p>body</p>", subtitle="alice & bob", footer="f'")
    skeleton = (TEMPLATES / "page.html").read_text()
    assert text.startswith("<!DOCTYPE html>") and skeleton.startswith("<!DOCTYPE html>")
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in text
    assert "<title>Feedback: &quot;01&quot; &lt;x&gt;</title>" in text
    assert '<p class="sub">alice &amp; bob</p>' in text and "<footer>f&#x27;</footer>" in text
    assert "<p>body</p>" in text
    assert table(None, [["x"]]) == "<table>\n<tr><td>x</td></tr>\n</table>"


def test_the_templates_ship_in_the_package():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert data["package-data"]["txlearn.course.gradebook"] == ["templates/*.html"]
    assert sorted(p.name for p in TEMPLATES.iterdir()) == ["page.html", "table.html"]
