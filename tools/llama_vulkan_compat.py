"""Let llama.cpp's Vulkan backend compile against Debian 12's Vulkan headers (1.3.239).

The pinned llama.cpp passes VK_EXT_layer_settings (validation-layer options, used only
when a developer asks for validation) to vkCreateInstance. Those types arrived in the
headers after 1.3.239, so on Debian 12 ggml-vulkan.cpp does not compile. This wraps that
one block in `#ifdef VK_EXT_layer_settings`: with newer headers nothing changes; with
older ones the instance is created without the validation settings.

Run by the Makefile on the unpacked sdist before building the Vulkan wheel:
    python tools/llama_vulkan_compat.py <llama_cpp_python source dir>
It is idempotent and fails loudly when the code it expects has moved, so a version bump
that changes the block is noticed at build time rather than silently left unpatched.
"""
import pathlib
import sys

MARK = "/* tryll_fast: old Vulkan headers */"
START = "    VkBool32 enable_best_practice = layer_settings;\n"
END = ("    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, "
       "layers, extensions, &layer_setting_info);\n")
FALLBACK = ("    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, "
            "layers, extensions);\n")


def patch(text: str) -> str:
    if MARK in text:
        return text
    start = text.find(START)
    end = text.find(END, start)
    if start < 0 or end < 0:
        raise SystemExit("llama_vulkan_compat: the layer-settings block of ggml-vulkan.cpp "
                         "was not found; check the pinned llama.cpp version")
    end += len(END)
    return (text[:start] + f"#ifdef VK_EXT_layer_settings {MARK}\n" + text[start:end]
            + "#else\n" + FALLBACK + "#endif\n" + text[end:])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = pathlib.Path(argv[0]) / "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp"
    if not path.is_file():
        raise SystemExit(f"llama_vulkan_compat: {path} does not exist")
    path.write_text(patch(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
