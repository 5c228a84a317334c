"""Chat templates: golden renders of the rStar template and of the default model's template with the tool
protocol injected, the pieces the agent loop measures, and per-model template choice."""

from __future__ import annotations

import pytest
from golden_files import check_text

from rstar.sandbox.tools import JUPYTER_TOOL, PYTHON_TOOL
from rstar.server.builtin_tools import builtin_tool_schemas
from rstar.server.chat_template import (
    ChatTemplate,
    choose_template,
    rstar_template,
    tool_call_text,
    tools_block,
)

TOOLS = builtin_tool_schemas([PYTHON_TOOL, JUPYTER_TOOL])
QUESTION = {"role": "user", "content": "Find the number of positive divisors of 2024."}
TOOL_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": PYTHON_TOOL, "arguments": {"code": "import sympy\nprint(sympy.divisor_count(2024))", "input": ""}},
}

CONVERSATIONS = {
    "question": [QUESTION],
    "system_replaces_default": [{"role": "system", "content": "You are a careful mathematician."}, QUESTION],
    "tool_conversation": [
        QUESTION,
        {"role": "assistant", "content": "<reason>Let me count them with sympy.", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "Tool call success\nstdout: 16\nexecution time: 0.41s"},
    ],
    "consecutive_tool_results_share_a_turn": [
        QUESTION,
        {
            "role": "assistant",
            "content": "<reason>Two checks.",
            "tool_calls": [TOOL_CALL, {"type": "function", "function": {"name": JUPYTER_TOOL, "arguments": {"code": "2024 % 8"}}}],
        },
        {"role": "tool", "content": "Tool call success\nstdout: 16\nexecution time: 0.41s"},
        {"role": "tool", "content": "Tool call success\nstdout: 0\nexecution time: 0.02s"},
    ],
    # The released template gave this assistant turn the user instruction prefix; ours renders it as is.
    "assistant_without_tool_calls": [
        QUESTION,
        {"role": "assistant", "content": "<reason>2024 = 2^3 * 11 * 23.</reason>\n<answer>\\boxed{16}</answer>"},
        {"role": "user", "content": "And of 2025?"},
    ],
    "later_system_message": [QUESTION, {"role": "system", "content": "Answer briefly."}],
    # OpenAI clients send arguments as a JSON string and content as parts; both render like the plain forms.
    "openai_wire_forms": [
        {"role": "user", "content": [{"type": "text", "text": "Find the number of positive divisors "}, {"type": "text", "text": "of 2024."}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**TOOL_CALL, "function": {"name": PYTHON_TOOL, "arguments": '{"code": "print(1)", "input": ""}'}}],
        },
        {"role": "tool", "content": "Tool call success\nstdout: 1\nexecution time: 0.01s"},
    ],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_rstar_template_golden(name):
    template = rstar_template()
    check_text(f"template/rstar_{name}.txt", template.render(CONVERSATIONS[name], TOOLS, add_generation_prompt=True))


def test_rstar_template_without_tools_golden():
    check_text("template/rstar_question_no_tools.txt", rstar_template().render([QUESTION], None, add_generation_prompt=True))


@pytest.mark.parametrize("name", ["question", "tool_conversation", "consecutive_tool_results_share_a_turn", "system_replaces_default"])
def test_default_model_template_with_injected_protocol_golden(default_tokenizer, name):
    template = choose_template(default_tokenizer, "SmolLM2-135M-Instruct")
    check_text(f"template/smollm2_{name}.txt", template.render(CONVERSATIONS[name], TOOLS, add_generation_prompt=True))


def test_user_turns_get_the_instruction_and_assistant_turns_do_not():
    text = rstar_template().render(CONVERSATIONS["assistant_without_tool_calls"], None, add_generation_prompt=False)
    instruction = "This is the problem:\n"
    assert text.count(instruction) == 2  # the two user messages
    assert "<|im_start|>assistant\n<reason>2024 = 2^3" in text
    assert "This is the problem:\nAnd of 2025?" in text


def test_python_constants_match_the_jinja_file():
    """Injection into other templates uses Python copies of the protocol text; they must agree."""
    text = rstar_template().render(CONVERSATIONS["tool_conversation"], TOOLS, add_generation_prompt=False)
    assert "\n\n" + tools_block(TOOLS) + "<|im_end|>" in text
    arguments = TOOL_CALL["function"]["arguments"]
    assert "\n" + tool_call_text(PYTHON_TOOL, arguments) + "<|im_end|>" in text


def test_measured_pieces_of_the_rstar_template():
    template = rstar_template()
    assert template.assistant_header == "<|im_start|>assistant\n"
    assert template.turn_end == "<|im_end|>\n"
    assert template.generation_prefix == "<reason>"
    assert template.starts_in_reasoning


def test_measured_pieces_of_the_default_model_template(default_tokenizer):
    template = choose_template(default_tokenizer, "SmolLM2-135M-Instruct")
    assert (template.kind, template.native_tools) == ("model", False)
    assert template.assistant_header == "<|im_start|>assistant\n"
    assert template.turn_end == "<|im_end|>\n"
    assert template.generation_prefix == ""
    assert not template.starts_in_reasoning


def test_template_choice(default_tokenizer, tmp_path):
    assert choose_template(default_tokenizer, "microsoft/rStar2-Agent-14B").kind == "rstar"
    assert choose_template(default_tokenizer, "SmolLM2-135M-Instruct", override="rstar").kind == "rstar"

    class NoTemplate:
        chat_template = None

    assert choose_template(NoTemplate(), "some/base-model").kind == "rstar"
    with pytest.raises(ValueError, match="no chat template"):
        choose_template(NoTemplate(), "some/base-model", override="model")

    path = tmp_path / "custom.jinja"
    path.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", encoding="utf-8")
    custom = choose_template(default_tokenizer, "x", override=str(path))
    assert (custom.kind, custom.native_tools) == ("file", False)


def test_a_hermes_speaking_template_renders_tools_itself():
    source = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}{{ '\\n' }}{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}{{ '\\n' }}{% endfor %}"
    )
    native = ChatTemplate(kind="file", source=source, native_tools=True)
    text = native.render(CONVERSATIONS["tool_conversation"], TOOLS, add_generation_prompt=False)
    assert text.startswith(f"TOOLS:{PYTHON_TOOL};{JUPYTER_TOOL};\n")
    assert f"<tool_call>{PYTHON_TOOL}</tool_call>" in text
    assert "tool: Tool call success" in text  # its own rendering of tool messages, not injected user turns


def test_encode_maps_chatml_markers_to_their_special_ids(default_tokenizer):
    template = rstar_template(default_tokenizer)
    ids = template.encode([QUESTION], TOOLS, add_generation_prompt=True)
    im_start, im_end = default_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids[0] == im_start
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2  # system, user, then the open assistant turn
    assert default_tokenizer.decode(ids) == template.render([QUESTION], TOOLS, add_generation_prompt=True)


# Two nested loops a client would size to hold the server: the source of GHSA-6fvq-23cw-5628's kind of attack.
RUNAWAY = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("name", ["chat_template", "tokenize", "return_dict", "tokenizer_kwargs", "messages"])
def test_request_variables_cannot_set_render_parameters(default_tokenizer, name):
    # `chat_template` would hand the tokenizer a whole Jinja source of the client's choosing.
    model = choose_template(default_tokenizer, "SmolLM2-135M-Instruct", override="model")
    with pytest.raises(ValueError, match=name):
        model.with_variables({name: RUNAWAY})


def test_only_the_variables_a_template_reads_reach_its_render(default_tokenizer):
    template = rstar_template(default_tokenizer)
    assert "math_instruction" in template.readable_variables
    variant = template.with_variables({"math_instruction": False, "nonce": 1})
    assert variant.variables == (("math_instruction", False),)
    assert "This is the problem" not in variant.render([QUESTION])


def test_a_render_stops_at_its_deadline():
    import time

    from rstar.server.chat_template import RenderTimeout, render_deadline

    runaway = ChatTemplate(kind="file", source=RUNAWAY)
    started = time.monotonic()
    with pytest.raises(RenderTimeout), render_deadline(0.2):
        runaway.render([QUESTION])
    assert time.monotonic() - started < 1.0
    # Outside the block the same thread renders without a limit again.
    assert ChatTemplate(kind="file", source="{{ messages[0].content }}").render([QUESTION]) == QUESTION["content"]
