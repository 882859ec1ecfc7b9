"""The files users edit: study, search-space and workload YAML. ``schema`` (pydantic models),
``knobs`` (the knobs a search space may name), ``expr`` (conditions and constraints), ``load``
(YAML -> validated models, errors naming the file and the key)."""
