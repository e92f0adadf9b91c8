"""The messages between llmgw's processes: typed values with one strict parser each, the
states as enums, one transport, and the OpenAPI documents generated from them."""
