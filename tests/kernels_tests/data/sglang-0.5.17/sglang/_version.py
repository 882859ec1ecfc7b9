# The version line of SGLang 0.5.17's sglang/_version.py (the tuner reads the version from it).
__version__ = version = '0.5.17'
