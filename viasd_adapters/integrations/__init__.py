"""Integrations with other libraries' extension points (transformers' `custom_generate`)."""
