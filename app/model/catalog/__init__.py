"""The catalog: which models a container serves and each one's settings (docs/models.md).

``build(settings)`` reads MODEL, MODELS, MODELS_DIR and MODELS_PRESET into a ``Catalog`` of
``ModelSpec``s, each with its own Settings validated by the Settings class; ``render`` prints it
as ``vertex-gguf models`` shows it. Folders are listed (on the disk or in Cloud Storage), nothing
is downloaded or loaded.
"""

from app.model.catalog.build import MODEL_OWN, build
from app.model.catalog.show import render
from app.model.catalog.spec import Catalog, CatalogError, ModelSpec

__all__ = ["MODEL_OWN", "Catalog", "CatalogError", "ModelSpec", "build", "render"]
