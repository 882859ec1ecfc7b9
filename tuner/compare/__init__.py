"""`tuner compare`: studies side by side across hardware and quantization. ``plan`` decides what
each study needs (run, continue, reuse) and checks the input; ``run`` runs it through the normal
study runner; ``table`` builds the comparison document; ``html`` renders it."""
