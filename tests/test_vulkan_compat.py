"""tools/llama_vulkan_compat.py: the patch that lets the pinned llama.cpp's Vulkan backend
compile against Debian 12's Vulkan headers (docs/configuration.md, "GPU builds")."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compat", ROOT / "tools/llama_vulkan_compat.py")
compat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compat)

SOURCE = ("static void init() {\n" + compat.START + "    std::vector<int> settings;\n"
          + compat.END + "    vk_instance.instance = vk::createInstance(instance_create_info);\n}\n")


def test_the_layer_settings_block_is_guarded_and_kept():
    out = compat.patch(SOURCE)
    head, rest = out.split("#ifdef VK_EXT_layer_settings", 1)
    assert head == "static void init() {\n"
    guarded, fallback = rest.split("#else\n", 1)
    assert compat.START in guarded and compat.END in guarded      # newer headers: unchanged
    assert fallback.startswith(compat.FALLBACK + "#endif\n")
    assert fallback.endswith("vk::createInstance(instance_create_info);\n}\n")


def test_patching_twice_changes_nothing():
    once = compat.patch(SOURCE)
    assert compat.patch(once) == once


def test_a_moved_block_fails_the_build_loudly():
    with pytest.raises(SystemExit, match="layer-settings block"):
        compat.patch("static void init() {}\n")


def test_the_command_line_patches_the_unpacked_sdist(tmp_path):
    target = tmp_path / "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    target.parent.mkdir(parents=True)
    target.write_text(SOURCE)
    assert compat.main([str(tmp_path)]) == 0
    assert compat.MARK in target.read_text()
    with pytest.raises(SystemExit, match="does not exist"):
        compat.main([str(tmp_path / "nowhere")])
