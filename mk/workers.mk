# Workers adapter targets (issue #4).
