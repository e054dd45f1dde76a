"""The deploy artifacts offline (Dockerfile, cloudbuild.yaml, terraform/, scripts) and the container."""
