"""The task table: every task the suite runs, one row each (a :class:`~.task.Task`).

The catalog validates ``task:`` against it; the planner, the inference check, a user's test and the
viewer dispatch through it (:func:`task_of`); run.py is rendered with its task's fragments and row
(run.py is a standalone script and imports nothing from this package, so the row travels in its
``SPEC``). A new task is one module of this package (its subclass of :class:`~.task.Task`, with its
run.py fragment in ``templates/tasks/``) and one row here. docs/tasks.md describes each task's path
and verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pytest_neuron_support.tasks.embedding import SentenceEmbedding
from pytest_neuron_support.tasks.forward import (
    CANDIDATE_LABELS,
    IMAGE_CANDIDATE_LABELS,
    IMAGE_HYPOTHESIS_TEMPLATE,
    MASKED_SENTENCES,
    SENTENCES,
    ZERO_SHOT_SENTENCES,
    ForwardTask,
    Reading,
)
from pytest_neuron_support.tasks.generation import ImageTextToText, TextGeneration
from pytest_neuron_support.tasks.speech import SpeechRecognition
from pytest_neuron_support.tasks.task import Task
from pytest_neuron_support.tasks.text2text import Text2TextGeneration
from pytest_neuron_support.tasks.text_to_image import TextToImage

#: The keywords an image or audio classifier's pipeline check passes: the top label, the direct path's decision.
TOP_LABEL: Mapping[str, int] = MappingProxyType({"top_k": 1})

TASKS: Mapping[str, Task] = MappingProxyType(
    {
        task.name: task
        for task in (
            TextGeneration("text-generation"),
            ImageTextToText("image-text-to-text"),
            SentenceEmbedding("feature-extraction"),
            SentenceEmbedding("sentence-similarity"),
            TextToImage("text-to-image"),
            SpeechRecognition("automatic-speech-recognition"),
            Text2TextGeneration("text2text-generation"),
            # Forward tasks: one row each (tasks/forward.py): the Auto class, transformers' registry of the
            # architectures it maps, and how the output is read.
            ForwardTask(
                "text-classification",
                "AutoModelForSequenceClassification",
                "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                Reading("logits", "sequence", sentences=SENTENCES),
            ),
            ForwardTask(
                "token-classification",
                "AutoModelForTokenClassification",
                "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
                Reading("logits", "tokens", sentences=SENTENCES),
            ),
            ForwardTask(
                "fill-mask",
                "AutoModelForMaskedLM",
                "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
                Reading("logits", "mask", sentences=MASKED_SENTENCES),
            ),
            ForwardTask(
                "image-classification",
                "AutoModelForImageClassification",
                "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
                Reading(
                    "logits",
                    "sequence",
                    inputs="image",
                    preprocessor="AutoImageProcessor",
                    pipeline_keywords=TOP_LABEL,
                ),
            ),
            ForwardTask(
                "audio-classification",
                "AutoModelForAudioClassification",
                "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
                Reading(
                    "logits",
                    "sequence",
                    inputs="audio",
                    preprocessor="AutoFeatureExtractor",
                    pipeline_keywords=TOP_LABEL,
                ),
            ),
            # A CTC speech recogniser (wav2vec2-style): each audio frame's character, beside Whisper's row.
            ForwardTask(
                "automatic-speech-recognition-ctc",
                "AutoModelForCTC",
                "MODEL_FOR_CTC_MAPPING_NAMES",
                Reading(
                    "logits", "positions", inputs="audio", preprocessor="AutoFeatureExtractor", numbers_per="input"
                ),
                pipeline_tag="automatic-speech-recognition",
            ),
            ForwardTask(
                "zero-shot-classification",
                "AutoModelForSequenceClassification",
                None,  # text-classification's registry: an NLI model is a sequence classifier
                Reading("logits", "sequence", sentences=ZERO_SHOT_SENTENCES, candidate_labels=CANDIDATE_LABELS),
            ),
            ForwardTask(
                "zero-shot-image-classification",
                "AutoModelForZeroShotImageClassification",
                "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
                Reading(
                    "logits_per_image",
                    "sequence",
                    inputs="image",
                    preprocessor="AutoProcessor",
                    candidate_labels=IMAGE_CANDIDATE_LABELS,
                    hypothesis_template=IMAGE_HYPOTHESIS_TEMPLATE,
                ),
            ),
            ForwardTask(
                "image-feature-extraction",
                "AutoModel",
                "MODEL_FOR_IMAGE_MAPPING_NAMES",
                Reading(
                    "last_hidden_state", "sequence", inputs="image", preprocessor="AutoImageProcessor", decides=False
                ),
            ),
            ForwardTask(
                "depth-estimation",
                "AutoModelForDepthEstimation",
                "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",
                Reading(
                    "predicted_depth", "sequence", inputs="image", preprocessor="AutoImageProcessor", decides=False
                ),
            ),
            ForwardTask(
                "object-detection",
                "AutoModelForObjectDetection",
                "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
                Reading("logits", "positions", inputs="image", preprocessor="AutoImageProcessor", also=("pred_boxes",)),
            ),
            ForwardTask(
                "image-segmentation",
                "AutoModelForSemanticSegmentation",
                "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
                Reading("logits", "pixels", inputs="image", preprocessor="AutoImageProcessor"),
            ),
        )
    }
)

#: Tasks whose Hub rankings the viewer shows (Trending and Downloads): the pipeline tag of every row, once (the
#: Hub ranks Whisper and wav2vec2 under one tag), so a user sees, for each task the suite can check, the Hub's
#: leading models beside what was checked.
RANKED_TASKS: tuple[str, ...] = tuple(dict.fromkeys(task.pipeline_tag for task in TASKS.values()))


def task_of(name: str) -> Task:
    """The row of task ``name`` (a name the catalog has validated)."""
    return TASKS[name]
