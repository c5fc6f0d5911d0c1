"""Audio out (and reference clips in): loading, the reference's post-processing, the stream's
incremental trim and join, and every file omnicore writes."""
