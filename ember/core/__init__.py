"""ember.core"""
