"""Mustache templates: the keys of SPEC §5, no HTML escaping, syntax errors caught early."""
import pytest

from tryll_fast.workflow.templates import TemplateError, Template, context


def render(source, **kw):
    base = dict(variables={}, instructions=[], locale="", user_message="")
    base.update(kw)
    return Template(source).render(context(**base))


def test_keys():
    out = render("{{var.name}} has {{var.gold}} gold; {{instruction_tone}}; "
                 "{{#instructions}}[{{name}}={{text}}]{{/instructions}}; {{locale}} "
                 "{{language_code}} {{language}}; said {{user_message}}",
                 variables={"name": "Brenna", "gold": 3},
                 instructions=[("tone", "be warm"), ("goal", "sell bread")],
                 locale="pt-BR", user_message="olá")
    assert out == ("Brenna has 3 gold; be warm; [tone=be warm][goal=sell bread]; pt-BR pt "
                   "Portuguese; said olá")


def test_sets_iterate_and_nothing_is_escaped():
    out = render("{{#var.quests}}<{{.}}>{{/var.quests}} & {{var.quote}}",
                 variables={"quests": ["a", "b"], "quote": "don't \"x\" <b>"})
    assert out == "<a><b> & don't \"x\" <b>"


def test_missing_keys_render_empty():
    assert render("[{{var.nope}}][{{instruction_none}}][{{locale}}]") == "[][][]"


@pytest.mark.parametrize("source", ["{{#a}}never closed", "{{/a}}", "{{#a}}x{{/b}}"])
def test_syntax_errors(source):
    with pytest.raises(TemplateError, match="Mustache syntax error"):
        Template(source)
