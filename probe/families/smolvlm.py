"""SmolVLM: Idefics3's layout (idefics3.py) with its own classes: a SigLIP-like vision tower, a pixel-shuffle
connector, a Llama decoder; tiles with `<row_R_col_C>` markers, then the global image.

transformers 5.25's SmolVLMProcessor needs the `num2words` package and a video processor (which needs
torchvision) even for images, so `tiny:smolvlm` reads its pictures with SmolVLM's image processor inside
Idefics3's processor, whose prompt for an image is the same string (transformers' smolvlm
`get_image_prompt_string` is Idefics3's; a test compares them). A real SmolVLM checkpoint loads its own
processor where those packages are installed.
"""

from __future__ import annotations

from .idefics3 import pixel_shuffle_family

FAMILY = pixel_shuffle_family("smolvlm", "Idefics3Processor", "SmolVLMImageProcessorPil", model_types=("smolvlm",),
                              takes_video=True)
