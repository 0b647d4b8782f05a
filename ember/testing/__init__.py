"""ember.testing"""
