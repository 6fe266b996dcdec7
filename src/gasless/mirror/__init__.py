"""The billing contract mirror: finalised contract events followed from the gateway into mirror tables."""
