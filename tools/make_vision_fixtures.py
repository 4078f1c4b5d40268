#!/usr/bin/env python3
"""Make the Qwen3.5 vision fixtures (tests/fixtures/vl-qwen35-*): tiny random checkpoints WITH a vision tower and their
own preprocessor_config.json, test images of several sizes and formats, and what transformers computes from them.

For each checkpoint (written by transformers `save_pretrained`, reloaded FROM DISK in float32 with the eager paths):
  logits_<prompt>.npy          teacher-forced logits [T_expanded, vocab] of an image+text prompt (two PNG images)
  logits_<prompt>_decode.npy   [GREEDY, vocab]: rows T..T+GREEDY-1 of one forward over prompt + greedy tokens
  reference.json               prompt ids as given to `sparkserve logits` (one image token per image), the expanded
                               ids, image grids, greedy ids, margins
Shared (tests/fixtures/vision-images/):
  *.png / *.jpg / *.webp / *.gif   the images (RGB, RGBA, palette, gray, EXIF-rotated JPEG, animated GIF/WebP)
  pixels.npz                        transformers' Qwen2VLImageProcessor pixel_values and grids for each image with the
                                    fixture preprocessor_config.json (np.savez_compressed; float32)
  images.json                       file -> grid, source size

Images go to transformers as transformers' load_image would give them (PIL open, exif_transpose), converted to RGB with
alpha composited over white (PIL paste with the alpha as mask, as vLLM does; sparkserve does the same; transformers'
own convert("RGB") would drop alpha instead).

`--unseen DIR` instead writes two checkpoints with other dimensions and seeds (MoE and dense) plus their references into
DIR, for the "checkpoint this project has not seen" check (tools/compare_vision_unseen.py); nothing from it is committed.

Made on the CPU of this project's development machine (torch 2.11.0 wheel, transformers 5.17.0, torchvision 0.26.0):
    python3 tools/make_vision_fixtures.py --out tests/fixtures
"""
import argparse
import copy
import io
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (kernel packages blocked, text init rules, reload helpers)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image, ImageOps  # noqa: E402
from transformers import (Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,  # noqa: E402
                          Qwen3_5MoeForConditionalGeneration)
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: E402

# Multimodal token ids inside the tiny vocab (the real ones are beyond it).
VISION_START, VISION_END, IMAGE, VIDEO = 990, 991, 992, 993
GREEDY = 12
PREPROCESSOR = {
    "size": {"shortest_edge": 4096, "longest_edge": 65536},  # 64x64 .. 256x256 pixels: 16 .. 256 patches
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    # Not Qwen's 0.5: channel-dependent values show a channel mix-up.
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3, "do_resize": True, "do_rescale": True, "do_normalize": True,
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}


def vision_config(model_type, out_hidden, hidden=32, heads=2, depth=2, inter=48, grid=8):
    return {"model_type": model_type, "depth": depth, "hidden_size": hidden, "hidden_act": "gelu_pytorch_tanh",
            "intermediate_size": inter, "num_heads": heads, "in_channels": 3, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": out_hidden,
            "num_position_embeddings": grid * grid, "initializer_range": 0.02, "deepstack_visual_indexes": []}


def outer(model_type, text, vision):
    arch = "Qwen3_5MoeForConditionalGeneration" if model_type == "qwen3_5_moe" else "Qwen3_5ForConditionalGeneration"
    return {"architectures": [arch], "model_type": model_type, "text_config": dict(text), "vision_config": vision,
            "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": VISION_START,
            "vision_end_token_id": VISION_END, "tie_word_embeddings": False}


def init_vision(model, seed):
    """Values that make every vision parameter matter: LayerNorm weights 1 + N(0, 0.2), biases N(0, 0.1), matrices
    N(0, 1/sqrt(fan_in)), the position grid N(0, 0.5); the merger's output scaled to the text embeddings' size."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if ".visual." not in name and not name.startswith("visual."):
            continue
        shape = tuple(p.shape)
        if name.endswith("pos_embed.weight"):
            v = torch.randn(shape, generator=gen) * 0.5
        elif "norm" in name and name.endswith(".weight"):
            v = 1 + torch.randn(shape, generator=gen) * 0.2
        elif name.endswith(".bias"):
            v = torch.randn(shape, generator=gen) * 0.1
        else:
            fan_in = int(np.prod(shape[1:]))
            v = torch.randn(shape, generator=gen) / np.sqrt(fan_in)
        with torch.no_grad():
            p.copy_(v)


# ----------------------------------------------------------------------------------------------- images


def smooth_noise(rng, h, w, channels=3):
    base = rng.randint(0, 256, (max(2, h // 6), max(2, w // 6), channels)).astype(np.uint8)
    img = np.array(Image.fromarray(base.squeeze()).resize((w, h), Image.BILINEAR))
    if img.ndim == 2:
        img = img[:, :, None]
    img = img.astype(np.int16) + rng.randint(-24, 25, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def exif_with_orientation(value):
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def make_images(folder, rng):
    """Writes the test images; returns their file names in order."""
    os.makedirs(folder, exist_ok=True)
    files = []

    def save(name, img, **kw):
        img.save(os.path.join(folder, name), **kw)
        files.append(name)

    save("a_70x100.png", Image.fromarray(smooth_noise(rng, 70, 100)))
    save("b_150x90.png", Image.fromarray(smooth_noise(rng, 150, 90)))
    save("c_300x200.jpg", Image.fromarray(smooth_noise(rng, 300, 200)), quality=88)
    save("d_97x257.webp", Image.fromarray(smooth_noise(rng, 97, 257)), quality=85)
    save("e_lossless_64x64.webp", Image.fromarray(smooth_noise(rng, 64, 64)), lossless=True)
    rgba = smooth_noise(rng, 80, 120, 4)
    rgba[:20, :, 3] = 0  # fully transparent band, a partly transparent rest
    save("f_rgba_80x120.png", Image.fromarray(rgba))
    save("g_gray_50x333.png", Image.fromarray(smooth_noise(rng, 50, 333, 1)[:, :, 0]))
    pal = Image.fromarray(smooth_noise(rng, 77, 77)).convert("P", palette=Image.ADAPTIVE, colors=32)
    save("h_palette_77x77.png", pal)
    save("i_exif6_120x60.jpg", Image.fromarray(smooth_noise(rng, 120, 60)), quality=90,
         exif=exif_with_orientation(6))
    save("j_exif3_64x96.jpg", Image.fromarray(smooth_noise(rng, 64, 96)), quality=90,
         exif=exif_with_orientation(3))
    frames = [Image.fromarray(smooth_noise(rng, 90, 110)).convert("P", palette=Image.ADAPTIVE, colors=64)
              for _ in range(2)]
    frames[0].save(os.path.join(folder, "k_anim_110x90.gif"), save_all=True, append_images=frames[1:], duration=50)
    files.append("k_anim_110x90.gif")
    wf = [Image.fromarray(smooth_noise(rng, 66, 130)) for _ in range(2)]
    wf[0].save(os.path.join(folder, "l_anim_130x66.webp"), save_all=True, append_images=wf[1:], duration=50,
               lossless=True)
    files.append("l_anim_130x66.webp")
    save("m_16bit_40x40.png", Image.fromarray(smooth_noise(rng, 40, 40, 1)[:, :, 0].astype(np.uint16) * 257))
    return files


def load_rgb(path):
    """As transformers' load_image (exif_transpose), RGB with alpha composited over white (vLLM's rgba_to_rgb)."""
    img = Image.open(path)
    img.seek(0)
    img = ImageOps.exif_transpose(img)
    if img.mode == "I;16":  # 16-bit gray: the high byte of each sample (libpng's strip_16)
        arr = (np.array(img, dtype=np.uint16) >> 8).astype(np.uint8)
        return Image.fromarray(arr).convert("RGB")
    has_alpha = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.split()[3])
        return white
    return img.convert("RGB")


def process(proc, paths):
    out = proc(images=[load_rgb(p) for p in paths], return_tensors="pt")
    return out["pixel_values"].float(), out["image_grid_thw"]


# ----------------------------------------------------------------------------------------------- references


def expand(ids, grids):
    out, types, k = [], [], 0
    for t in ids:
        if t == IMAGE:
            n = int(grids[k].prod()) // 4
            out += [IMAGE] * n
            types += [1] * n
            k += 1
        else:
            out.append(t)
            types.append(0)
    return out, types


def forward(model, ids, types, pixels, grids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]), pixel_values=pixels,
                    image_grid_thw=grids, use_cache=False)
    return out.logits[0].float()


def references(model, prompt, pixels, grids):
    ids, types = expand(prompt, grids)
    logits = forward(model, ids, types, pixels, grids)
    greedy, margins = [], []
    seq, st = list(ids), list(types)
    for _ in range(GREEDY):
        row = forward(model, seq, st, pixels, grids)[-1]
        top = torch.topk(row, 2)
        greedy.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(greedy[-1])
        st.append(0)
    full = forward(model, seq, st, pixels, grids)
    decode = full[len(ids):len(ids) + GREEDY]
    # transformers' own cached generate (M-RoPE deltas kept for decode) must give the same ids.
    with torch.no_grad():
        gen = model.generate(input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]),
                             pixel_values=pixels, image_grid_thw=grids, max_new_tokens=GREEDY, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    cached = [int(x) for x in gen[0, len(ids):]]
    return ids, logits, greedy, margins, decode, {
        "hf_generate_cached_ids_equal": cached == greedy,
        "prompt_rows_vs_full_sequence_max_abs_diff": float((full[:len(ids)] - logits).abs().max()),
        "logits_std": float(logits.std()), "logits_max_abs": float(logits.abs().max()),
    }


def write_checkpoint(folder, cls, cfg_dict, seed, save_kwargs):
    torch.manual_seed(seed)
    cfg = (Qwen3_5MoeConfig if cls is Qwen3_5MoeForConditionalGeneration else Qwen3_5Config).from_dict(cfg_dict)
    model = cls(cfg)
    mf.init_text_weights(model, seed + 1)
    init_vision(model, seed + 2)
    model = model.to(torch.bfloat16).eval()
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, **save_kwargs)
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=2)
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reloaded, info = mf.load_reloaded(cls, folder)
    mf.check_reloaded_params(reloaded, expected, folder)
    return reloaded


def make_case(folder, cls, cfg_dict, seed, image_dir, prompt_images, save_kwargs, text_rng):
    model = write_checkpoint(folder, cls, cfg_dict, seed, save_kwargs)
    proc = Qwen2VLImageProcessor(**{k: v for k, v in PREPROCESSOR.items() if k not in ("processor_class", "image_processor_type")})
    pixels, grids = process(proc, [os.path.join(image_dir, p) for p in prompt_images])
    vocab = cfg_dict["text_config"]["vocab_size"]
    text = lambda n: [int(x) for x in text_rng.randint(0, VISION_START, n)]  # noqa: E731
    prompt = text(5) + [VISION_START, IMAGE, VISION_END] + text(7) + [VISION_START, IMAGE, VISION_END] + text(4)
    assert max(prompt) < vocab
    ids, logits, greedy, margins, decode, extra = references(model, prompt, pixels, grids)
    np.save(os.path.join(folder, "logits_two_images.npy"), logits.numpy().astype("<f4"))
    np.save(os.path.join(folder, "logits_two_images_decode.npy"), decode.numpy().astype("<f4"))
    ref = {
        "made_by": "tools/make_vision_fixtures.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "prompts": [{
            "name": "two_images", "images": prompt_images, "prompt_ids": prompt, "expanded_ids": ids,
            "image_grid_thw": grids.tolist(), "logits_file": "logits_two_images.npy",
            "logits_shape": list(logits.shape), "greedy_ids": greedy, "greedy_top1_top2_margins": margins,
            "greedy_min_margin": min(margins), "decode_logits_file": "logits_two_images_decode.npy", **extra}],
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(folder, "T", len(ids), "greedy", greedy, "min margin", min(margins), extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="fixtures folder (tests/fixtures)")
    ap.add_argument("--unseen", help="write the unseen checkpoints + references here instead")
    a = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.RandomState(20261201)
    if a.unseen:
        image_dir = os.path.join(a.unseen, "images")
        files = make_images(image_dir, np.random.RandomState(777))
        moe = copy.deepcopy(mf.MOE_TEXT)
        moe.update(vocab_size=997, hidden_size=48, num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                   num_hidden_layers=4, layer_types=[mf.FULL, mf.LINEAR, mf.LINEAR, mf.FULL], num_experts=5,
                   num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=20,
                   partial_rotary_factor=0.5)
        moe["rope_parameters"] = {"rope_type": "default", "rope_theta": 3000000, "partial_rotary_factor": 0.5,
                                  "mrope_section": [3, 3, 2], "mrope_interleaved": True}
        dense = copy.deepcopy(mf.DENSE_TEXT)
        dense.update(vocab_size=995, hidden_size=56, intermediate_size=72, num_hidden_layers=3,
                     layer_types=[mf.LINEAR, mf.FULL, mf.LINEAR], partial_rotary_factor=0.25, head_dim=48)
        dense["rope_parameters"] = {"rope_type": "default", "rope_theta": 100000, "partial_rotary_factor": 0.25,
                                    "mrope_section": [2, 2, 2], "mrope_interleaved": True}
        pngs = ["b_150x90.png", "a_70x100.png"]
        make_case(os.path.join(a.unseen, "vl-moe-unseen"), Qwen3_5MoeForConditionalGeneration,
                  outer("qwen3_5_moe", moe, vision_config("qwen3_5_moe_vision", 48, hidden=48, heads=3, depth=3,
                                                          inter=40, grid=6)),
                  4242, image_dir, pngs, {}, rng)
        make_case(os.path.join(a.unseen, "vl-dense-unseen"), Qwen3_5ForConditionalGeneration,
                  outer("qwen3_5", dense, vision_config("qwen3_5_vision", 56, hidden=64, heads=4, depth=1,
                                                        inter=80, grid=10)),
                  5151, image_dir, pngs, {}, rng)
        return
    image_dir = os.path.join(a.out, "vision-images")
    files = make_images(image_dir, np.random.RandomState(20261201))
    proc = Qwen2VLImageProcessor(**{k: v for k, v in PREPROCESSOR.items() if k not in ("processor_class", "image_processor_type")})
    arrays, meta = {}, {}
    for i, name in enumerate(files):
        pixels, grids = process(proc, [os.path.join(image_dir, name)])
        arrays[f"pixels_{i}"] = pixels.numpy().astype("<f4")
        with Image.open(os.path.join(image_dir, name)) as im:
            size = [im.height, im.width]
        meta[name] = {"array": f"pixels_{i}", "grid_thw": grids[0].tolist(), "source_hw": size}
    np.savez_compressed(os.path.join(image_dir, "pixels.npz"), **arrays)
    with open(os.path.join(image_dir, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=2)
    with open(os.path.join(image_dir, "images.json"), "w") as f:
        json.dump({"made_by": "tools/make_vision_fixtures.py", "transformers": transformers.__version__,
                   "images": meta}, f, indent=1)
    pngs = ["a_70x100.png", "b_150x90.png"]
    make_case(os.path.join(a.out, "vl-qwen35-moe-tiny"), Qwen3_5MoeForConditionalGeneration,
              outer("qwen3_5_moe", mf.MOE_TEXT, vision_config("qwen3_5_moe_vision", mf.MOE_TEXT["hidden_size"])),
              mf.SEED, image_dir, pngs, {"save_original_format": False}, rng)
    make_case(os.path.join(a.out, "vl-qwen35-dense-tiny"), Qwen3_5ForConditionalGeneration,
              outer("qwen3_5", mf.DENSE_TEXT, vision_config("qwen3_5_vision", mf.DENSE_TEXT["hidden_size"], depth=1)),
              mf.SEED + 100, image_dir, pngs, {}, rng)


if __name__ == "__main__":
    main()
