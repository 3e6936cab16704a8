NAME = "a package beside the notebook"
